"""The in-process service for asyncio programs: ``AsyncService``.

``bridge.Service`` runs on trio, inside ``trio.run``; under ``asyncio.run`` it cannot start.
``AsyncService`` runs a ``Service`` on trio in a thread of its own and offers its operations
as coroutines of the caller's event loop, asyncio's (or trio's: the same code runs under
both), and a turn's events as an async iterator::

    async with AsyncService.running(EngineRegistry(default="scripted")) as svc:
        await svc.create(NpcConfig(npc_id="keeper", instructions="Be brief."))
        turn = await svc.respond(RespondParams(npc_id="keeper", prompt="Any ale?"))
        async for event in svc.events(turn.turn_id):
            ...

The operations take and return the same typed messages as ``Service``'s and raise the same
``BridgeError``s; each call goes to the service's thread and its result comes back (two
thread hand-offs, about a tenth of a millisecond). Calls made one after another run in that
order; a call the caller stops waiting for (its task cancelled) is cancelled in the service
too. A turn's events come one at a time as the caller reads them, so a caller that stops
reading slows its turns down instead of growing memory, as ``Service.events`` does. Leaving
``running`` ends every turn (``turn_ended``) and closes the engines, as ``Service.running``
does, then the thread; calls after it raise ``ServiceStopped``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar, cast

import trio

from bridge.core import _messages as m
from bridge.core._service import Service
from bridge.engines import EngineRegistry

T = TypeVar("T")


class ServiceStopped(RuntimeError):
    """The service's thread is not running (not started yet, or stopped)."""


class _Handoff(Generic[T]):
    """One result (a value or an exception), settled from the service's thread and awaited in
    the caller's event loop, asyncio's or trio's. ``scope`` and ``abandoned`` belong to the
    service's thread: the call's cancel scope, and whether the caller stopped waiting."""

    def __init__(self) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self.scope: trio.CancelScope | None = None
        self.abandoned = False
        self._future: asyncio.Future[None] | None = None
        self._event: trio.Event | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio: trio (or neither, and current_trio_token says so)
            self._loop = None
            self._token = trio.lowlevel.current_trio_token()
            self._event = trio.Event()
        else:
            self._future = self._loop.create_future()

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        """From any thread: the call's result. Dropped if the caller's loop is gone."""
        self._value, self._error = value, error
        try:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._done_asyncio)
            else:
                self._token.run_sync_soon(self._done_trio)
        except (RuntimeError, trio.RunFinishedError):
            pass  # the caller's event loop has ended: nobody waits

    @property
    def arrived(self) -> bool:
        """In the caller's loop: whether the result has come."""
        if self._future is not None:
            return self._future.done()
        assert self._event is not None
        return self._event.is_set()

    def _done_asyncio(self) -> None:
        assert self._future is not None
        if not self._future.done():
            self._future.set_result(None)

    def _done_trio(self) -> None:
        assert self._event is not None
        self._event.set()

    async def wait(self, *, shield: bool = False) -> T:
        """The result (raising the call's exception). ``shield``: wait even if the caller is
        cancelled meanwhile (then re-raise its cancellation)."""
        if self._future is not None:
            if not shield:
                await self._future
            else:
                cancelled: asyncio.CancelledError | None = None
                while not self._future.done():
                    try:
                        await asyncio.shield(self._future)
                    except asyncio.CancelledError as e:
                        cancelled = e
                if cancelled is not None:
                    raise cancelled
        else:
            assert self._event is not None
            with trio.CancelScope(shield=shield):
                await self._event.wait()
        if self._error is not None:
            raise self._error
        return cast(T, self._value)


class AsyncService:
    """A ``Service`` on trio in a thread of its own, with its operations as coroutines of the
    caller's event loop. Start it with ``running`` (an async context manager)."""

    def __init__(self, registry: EngineRegistry | None = None, limits: m.Limits | None = None) -> None:
        self._registry = registry
        self._limits = limits
        self._service: Service | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._calls: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._done: _Handoff[None] | None = None  # the thread's end

    # ---- running ----

    @classmethod
    @asynccontextmanager
    async def running(
        cls, registry: EngineRegistry | None = None, limits: m.Limits | None = None
    ) -> AsyncIterator[AsyncService]:
        """A service running in its own thread until the block ends; then every turn is
        ended (``turn_ended``), the engines are closed and the thread has ended."""
        svc = cls(registry, limits)
        await svc._start()
        try:
            yield svc
        finally:
            await svc._close()

    async def _start(self) -> None:
        ready: _Handoff[None] = _Handoff()
        done: _Handoff[None] = _Handoff()
        self._done = done

        def thread() -> None:
            try:
                trio.run(self._serve, ready)
            except BaseException as e:  # noqa: BLE001 (handed to the caller, whatever it is)
                ready.settle(error=e)  # a failure before ready reaches _start, after it _close
                done.settle(error=e)
            else:
                done.settle()

        self._thread = threading.Thread(target=thread, name="oam-bridge service", daemon=True)
        self._thread.start()
        await ready.wait(shield=True)

    async def _serve(self, ready: _Handoff[None]) -> None:
        async with Service.running(self._registry, self._limits) as service:
            async with trio.open_nursery() as calls:
                self._service, self._calls = service, calls
                self._stop = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                ready.settle()
                await self._stop.wait()
                calls.cancel_scope.cancel()  # calls still waiting end with ServiceStopped
        self._token, self._service, self._calls = None, None, None

    async def _close(self) -> None:
        token, stop = self._token, self._stop
        if token is not None and stop is not None:
            try:
                token.run_sync_soon(stop.set)
            except trio.RunFinishedError:
                pass
        if self._done is not None:
            await self._done.wait(shield=True)

    # ---- calls into the service's thread ----

    def _post(self, fn: Callable[..., object], *args: Any) -> None:
        if self._token is None:
            raise ServiceStopped("the service is not running")
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            raise ServiceStopped("the service is not running") from None

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the service's thread."""
        return cast(T, await self._dispatch(fn, args))

    async def _await(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` in the service's thread."""
        return cast(T, await self._dispatch(fn, args))

    async def _dispatch(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        handoff: _Handoff[Any] = _Handoff()
        self._post(self._begin, handoff, fn, args)
        try:
            return await handoff.wait()
        except BaseException:
            if not handoff.arrived:  # the caller stopped waiting: the call stops too
                try:
                    self._post(self._abandon, handoff)
                except ServiceStopped:
                    pass
            raise

    def _begin(self, handoff: _Handoff[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        # In the service's thread, outside any task: it must not raise (trio would crash).
        try:
            if self._calls is None:
                raise RuntimeError("stopped")
            self._calls.start_soon(self._run, handoff, fn, args)
        except RuntimeError:  # the nursery is closed: the service is stopping
            handoff.settle(error=ServiceStopped("the service is stopping"))

    async def _run(self, handoff: _Handoff[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if handoff.abandoned:
            return  # the caller stopped waiting before the call began: it does not happen
        settled = False
        try:
            with trio.CancelScope() as handoff.scope:
                try:
                    value = fn(*args)
                    if inspect.isawaitable(value):
                        value = await value
                except Exception as e:  # the operation's error is the caller's
                    handoff.settle(error=e)
                else:
                    handoff.settle(value)
                settled = True
        finally:
            if not settled:
                handoff.settle(error=ServiceStopped("the service stopped before the call ended"))

    @staticmethod
    def _abandon(handoff: _Handoff[Any]) -> None:
        handoff.abandoned = True
        if handoff.scope is not None:
            handoff.scope.cancel()

    # ---- operations: Service's, as coroutines ----

    @property
    def service(self) -> Service:
        """The ``Service`` itself, for code that runs in its thread (not the caller's)."""
        if self._service is None:
            raise ServiceStopped("the service is not running")
        return self._service

    async def create(self, config: m.NpcConfig) -> m.CreateResult:
        return await self._await(self.service.create, config)

    async def restore(self, p: m.RestoreParams) -> m.RestoreResult:
        return await self._await(self.service.restore, p)

    async def respond(self, p: m.RespondParams) -> m.RespondResult:
        return await self._call(self.service.respond, p)

    async def decide(self, p: m.DecideParams) -> m.RespondResult:
        return await self._await(self.service.decide, p)

    async def prewarm(self, p: m.PrewarmParams) -> m.RespondResult:
        return await self._call(self.service.prewarm, p)

    async def set_tags(self, p: m.SetTagsParams) -> m.EmptyResult:
        return await self._call(self.service.set_tags, p)

    async def world_set(self, p: m.WorldSetParams) -> m.WorldRevision:
        return await self._call(self.service.world_set, p)

    async def world_delete(self, p: m.WorldKey) -> m.WorldDeleteResult:
        return await self._call(self.service.world_delete, p)

    async def world_get(self, p: m.WorldGetParams) -> m.WorldGetResult:
        return await self._call(self.service.world_get, p)

    async def submit(self, p: m.SubmitParams) -> m.SubmitResult:
        return await self._call(self.service.submit, p)

    async def cancel(self, p: m.NpcRef) -> m.CancelResult:
        return await self._call(self.service.cancel, p)

    async def transcript(self, p: m.NpcRef) -> m.Save:
        return await self._call(self.service.transcript, p)

    async def reset(self, p: m.NpcRef) -> m.EmptyResult:
        return await self._call(self.service.reset, p)

    async def delete(self, p: m.NpcRef) -> m.EmptyResult:
        return await self._call(self.service.delete, p)

    async def list(self) -> m.NpcListResult:
        return await self._call(self.service.list)

    async def count_tokens(self, p: m.CountTokensParams) -> m.CountTokensResult:
        return await self._await(self.service.count_tokens, p)

    async def engine_status(self) -> m.EngineStatusResult:
        return await self._call(self.service.engine_status)

    async def wait_idle(self) -> None:
        """Return once no turn runs or waits, in any NPC."""
        await self._await(self.service.wait_idle)

    async def events(self, turn_id: str) -> AsyncIterator[m.Event]:
        """A turn's events, ending with its terminal event, each taken from the service as
        the caller asks for it. Leaving early (``break``) tells the service to stop keeping
        the turn's events."""
        service = self.service
        stream = await self._call(service.events, turn_id)
        ended = False
        try:
            while True:
                event = await self._await(stream.__anext__)
                yield event
                if isinstance(event, (m.TurnCompleted, m.TurnFailed)):
                    ended = True
                    return
        finally:
            if not ended:
                try:
                    self._post(self._leave_events, service, stream, turn_id)
                except ServiceStopped:
                    pass

    def _leave_events(self, service: Service, stream: AsyncIterator[m.Event], turn_id: str) -> None:
        """The caller left a turn's events early: the service stops keeping them, and the
        stream is closed (unless a read of it, cancelled, is still ending it)."""
        service.drop_events(turn_id)
        close = getattr(stream, "aclose", None)
        if close is None or self._calls is None:
            return

        async def aclose() -> None:
            try:
                await close()
            except RuntimeError:
                pass  # still running: the cancelled read ends it

        try:
            self._calls.start_soon(aclose)
        except RuntimeError:
            pass  # the service is stopping: the stream goes with it


__all__ = ["AsyncService", "ServiceStopped"]
