"""oam-bridge: NPC brains for any game engine, over line-delimited JSON-RPC on stdio.

The public API is what ``__all__`` names: the service and the JSON-RPC server that hosts it,
the engines to run them on, the errors, and ``bridge.messages`` (every wire type). Import
these from here and from ``bridge.messages``: where they are defined may change.

``Service`` runs on trio. An asyncio program uses ``bridge.aio.AsyncService`` (imported from
``bridge.aio``, so that ``import bridge`` does not import asyncio): the same operations as
coroutines, on a service that runs on trio in a thread of its own.
"""

from bridge import messages
from bridge._version import __version__
from bridge.core._service import Service
from bridge.engines import EngineRegistry
from bridge.engines.scripted import ScriptedEngine
from bridge.errors import ERROR_CODES, BridgeError, ErrorKind
from bridge.jsonrpc._server import Server
from bridge.messages import Limits

__all__ = [
    "ERROR_CODES",
    "BridgeError",
    "EngineRegistry",
    "ErrorKind",
    "Limits",
    "ScriptedEngine",
    "Server",
    "Service",
    "__version__",
    "messages",
]
