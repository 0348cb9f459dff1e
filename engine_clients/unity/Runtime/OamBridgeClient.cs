using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;

namespace Oam.Bridge
{
    /// <summary>
    /// Client for oam-bridge: starts the bridge process and speaks line-delimited JSON-RPC 2.0
    /// with it (protocol.md). Engine-agnostic (no UnityEngine).
    /// <para>Threading: one thread writes stdin, one reads stdout, one reads stderr. Responses
    /// complete their tasks from the reader thread (continuations run asynchronously, so an
    /// <c>await</c> resumes on the caller's SynchronizationContext). Events, <see cref="Log"/>
    /// lines, tool handlers and <see cref="Turn"/> completion go through <see cref="Dispatch"/>,
    /// in arrival order.</para>
    /// </summary>
    public sealed class OamBridgeClient : IDisposable
    {
        public const int ProtocolVersion = 1;

        static readonly UTF8Encoding Utf8NoBom = new UTF8Encoding(false);
        const int MaxEarlyEvents = 4096;

        readonly Process _process;
        readonly Thread _stderrThread;
        readonly BlockingCollection<string> _outbox = new BlockingCollection<string>();
        readonly object _gate = new object();
        readonly Dictionary<long, Pending> _pending = new Dictionary<long, Pending>();
        readonly Dictionary<string, Turn> _turns = new Dictionary<string, Turn>();
        // events of a turn whose npc/respond response has not been read yet (not expected: the
        // bridge answers before the turn streams; kept until the turn is claimed or ends)
        readonly Dictionary<string, List<TurnEvent>> _early = new Dictionary<string, List<TurnEvent>>();
        int _earlyCount;
        int _respondsInFlight; // npc/respond, npc/decide, npc/prewarm not answered yet: only they can claim early events
        readonly ConcurrentDictionary<string, Func<JToken, Task<JToken>>> _tools =
            new ConcurrentDictionary<string, Func<JToken, Task<JToken>>>();
        readonly TaskCompletionSource<int> _exited =
            new TaskCompletionSource<int>(TaskCreationOptions.RunContinuationsAsynchronously);
        long _nextId;
        OamBridgeException _closed; // set once stdout ended or stdin broke
        int _disposed;

        OamBridgeClient(Process process, Action<string> log)
        {
            _process = process;
            if (log != null) Log += log;
            _stderrThread = StartThread(ErrorLoop, "oam-bridge stderr");
            StartThread(WriteLoop, "oam-bridge stdin");
            StartThread(ReadLoop, "oam-bridge stdout");
        }

        /// <summary>Starts the bridge, e.g. <c>Start("/game/.venv/bin/python", "-m bridge", "/game")</c>.</summary>
        /// <param name="log">Receives stderr lines from the start (same as subscribing <see cref="Log"/>).</param>
        public static OamBridgeClient Start(string fileName, string arguments = "", string workingDirectory = null,
            Action<string> log = null)
        {
            var psi = new ProcessStartInfo(fileName, arguments ?? "");
            if (!string.IsNullOrEmpty(workingDirectory)) psi.WorkingDirectory = workingDirectory;
            return Start(psi, log);
        }

        /// <summary>Starts the bridge from a ProcessStartInfo; redirection, encodings and shell use are set here.</summary>
        public static OamBridgeClient Start(ProcessStartInfo startInfo, Action<string> log = null)
        {
            if (startInfo == null) throw new ArgumentNullException(nameof(startInfo));
            startInfo.UseShellExecute = false;
            startInfo.CreateNoWindow = true;
            startInfo.RedirectStandardInput = true;
            startInfo.RedirectStandardOutput = true;
            startInfo.RedirectStandardError = true;
            startInfo.StandardOutputEncoding = Utf8NoBom;
            startInfo.StandardErrorEncoding = Utf8NoBom;
            if (!startInfo.EnvironmentVariables.ContainsKey("PYTHONUTF8"))
                startInfo.EnvironmentVariables["PYTHONUTF8"] = "1";
            var process = Process.Start(startInfo)
                          ?? throw new InvalidOperationException("could not start " + startInfo.FileName);
            return new OamBridgeClient(process, log);
        }

        // ------------------------------------------------------------------ hooks and events

        /// <summary>
        /// Where events, log lines, tool handlers and turn completions run. Null (default): inline
        /// on the reader thread (handlers must then not block). The Unity layer posts them to the
        /// main thread. Set it before the first request.
        /// </summary>
        public Action<Action> Dispatch { get; set; }

        /// <summary>The bridge's stderr, line by line, plus the client's own diagnostics.</summary>
        public event Action<string> Log;

        /// <summary>Every <c>turn/*</c> event, before the specific event below.</summary>
        public event Action<TurnEvent> EventReceived;
        public event Action<TurnStartedEvent> TurnStarted;
        public event Action<TextDeltaEvent> TextDelta;
        public event Action<PartialJsonEvent> PartialJson;
        /// <summary>Raised before a registered handler (if any) runs and submits its output.</summary>
        public event Action<ToolCallRequestedEvent> ToolCallRequested;
        /// <summary>A registered handler's answer was submitted (or the submit failed, e.g. the call timed out).</summary>
        public event Action<ToolCallSubmission> ToolCallSubmitted;
        public event Action<ToolCallCompletedEvent> ToolCallCompleted;
        public event Action<ToolCallWithdrawnEvent> ToolCallWithdrawn;
        public event Action<ContextTrimmedEvent> ContextTrimmed;
        public event Action<TurnCompletedEvent> Completed;
        public event Action<TurnFailedEvent> Failed;

        /// <summary>False once the bridge closed its output (exited) or the client was disposed.</summary>
        public bool IsRunning => Volatile.Read(ref _closed) == null && Volatile.Read(ref _disposed) == 0;

        /// <summary>The bridge process's id (e.g. to check it is gone after the game quits).</summary>
        public int ProcessId => _process.Id;

        /// <summary>Completes with the bridge's exit code when the process has exited.</summary>
        public Task<int> WaitForExitAsync() => _exited.Task;

        // ------------------------------------------------------------------ tools

        /// <summary>
        /// Handles <c>turn/toolCallRequested</c> for tool <paramref name="name"/> of NPC
        /// <paramref name="npcId"/> (null: every NPC; an NPC's own handler wins). The handler gets
        /// the arguments and runs on <see cref="Dispatch"/>; its result is submitted as
        /// <c>output</c>, an exception (or fault) as <c>error</c> (its message). Calls of tools
        /// without a handler are left to <see cref="ToolCallRequested"/> and <see cref="SubmitOutputAsync"/>.
        /// </summary>
        public void RegisterTool(string npcId, string name, Func<JToken, Task<JToken>> handler)
        {
            if (name == null) throw new ArgumentNullException(nameof(name));
            if (handler == null) throw new ArgumentNullException(nameof(handler));
            _tools[ToolKey(npcId, name)] = handler;
        }

        /// <summary>Synchronous handler; see <see cref="RegisterTool(string, string, Func{JToken, Task{JToken}})"/>.</summary>
        public void RegisterTool(string npcId, string name, Func<JToken, JToken> handler)
        {
            if (handler == null) throw new ArgumentNullException(nameof(handler));
            RegisterTool(npcId, name, args => Task.FromResult(handler(args)));
        }

        /// <summary>A handler for tool <paramref name="name"/> of every NPC.</summary>
        public void RegisterTool(string name, Func<JToken, Task<JToken>> handler) => RegisterTool(null, name, handler);

        /// <summary>A synchronous handler for tool <paramref name="name"/> of every NPC.</summary>
        public void RegisterTool(string name, Func<JToken, JToken> handler) => RegisterTool(null, name, handler);

        public bool UnregisterTool(string npcId, string name) => _tools.TryRemove(ToolKey(npcId, name), out _);

        static string ToolKey(string npcId, string name) => (npcId ?? "") + "\u0000" + name;

        // ------------------------------------------------------------------ protocol methods

        public Task<InitializeResult> InitializeAsync(string clientName = "oam-unity", string clientVersion = "",
            CancellationToken cancellationToken = default(CancellationToken))
        {
            var p = new JObject { ["protocolVersion"] = ProtocolVersion };
            if (clientName != null)
                p["clientInfo"] = new JObject { ["name"] = clientName, ["version"] = clientVersion ?? "" };
            return Call("initialize", p, r => new InitializeResult(AsObject(r)), cancellationToken);
        }

        public Task<NpcInfo> CreateNpcAsync(NpcConfig config, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (config == null) throw new ArgumentNullException(nameof(config));
            return Call("npc/create", config.ToJson(), r => new NpcInfo(AsObject(r)), cancellationToken);
        }

        /// <summary>
        /// Starts a turn (<c>npc/respond</c>). Completes when the bridge accepted it, with the
        /// turn's handle; await the handle for the result. Cancelling the token abandons the wait
        /// for acceptance only; use <see cref="CancelAsync"/> or <see cref="AskAsync"/> to stop a turn.
        /// </summary>
        public Task<Turn> RespondAsync(string npcId, string prompt, RespondOptions options = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            var p = new JObject { ["npcId"] = npcId, ["prompt"] = prompt };
            options?.WriteTo(p);
            return StartTurn("npc/respond", npcId, TurnKinds.Respond, p, cancellationToken);
        }

        /// <summary>
        /// Starts a decision (<c>npc/decide</c>): the NPC picks one of <paramref name="choices"/> for
        /// <paramref name="situation"/>. A turn like <see cref="RespondAsync"/>'s (queued behind the NPC's
        /// other turns, cancellable, streams <see cref="PartialJson"/>); its result's <c>Json</c> is
        /// <c>{"reasoning", "choice", "arguments"}</c>: wrap it in <see cref="Decision"/>, or use <see cref="ChooseAsync"/>.
        /// </summary>
        public Task<Turn> DecideAsync(string npcId, string situation, IEnumerable<DecisionOption> choices,
            DecideOptions options = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (choices == null) throw new ArgumentNullException(nameof(choices));
            var p = new JObject
            {
                ["npcId"] = npcId, ["situation"] = situation,
                ["options"] = new JArray(choices.Select(c => (object)c.ToJson()).ToArray()),
            };
            options?.WriteTo(p);
            return StartTurn("npc/decide", npcId, TurnKinds.Decide, p, cancellationToken);
        }

        /// <summary>
        /// Runs a decision to its end and returns it typed. Cancelling the token sends <c>npc/cancel</c>
        /// for the NPC, as <see cref="AskAsync"/> does.
        /// </summary>
        public async Task<Decision> ChooseAsync(string npcId, string situation, IEnumerable<DecisionOption> choices,
            DecideOptions options = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            Turn turn = await DecideAsync(npcId, situation, choices, options, cancellationToken).ConfigureAwait(false);
            return new Decision(await WaitCancellable(turn, cancellationToken).ConfigureAwait(false));
        }

        /// <summary>
        /// <c>npc/prewarm</c>: prepares the NPC (instructions, world facts, tools, history) before the
        /// player reaches it, so its first words come sooner. A turn of the NPC that changes no
        /// history: it completes with <c>FinishReason == "prewarmed"</c>, <c>Steps == 0</c>, <c>Text == ""</c>.
        /// When the game knows who will speak to the NPC next (<paramref name="speaker"/>, as
        /// <see cref="RespondOptions.Speaker"/>: another NPC's id or a name; null: the player) or how that
        /// line starts (<paramref name="promptPrefix"/>), that lead-in is prepared too; null leaves them out.
        /// </summary>
        public Task<Turn> PrewarmAsync(string npcId, string speaker = null, string promptPrefix = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            JObject p = NpcRef(npcId);
            if (speaker != null) p["speaker"] = speaker;
            if (promptPrefix != null) p["promptPrefix"] = promptPrefix;
            return StartTurn("npc/prewarm", npcId, TurnKinds.Prewarm, p, cancellationToken);
        }

        /// <summary><see cref="PrewarmAsync(string, string, string, CancellationToken)"/> for the player's next line.</summary>
        public Task<Turn> PrewarmAsync(string npcId, CancellationToken cancellationToken) =>
            PrewarmAsync(npcId, null, null, cancellationToken);

        // the turn's handle is made on the reader thread before the turn's first event is read
        Task<Turn> StartTurn(string method, string npcId, string kind, JObject p, CancellationToken cancellationToken) =>
            Call(method, p, r => ClaimTurn(npcId, AsObject(r).Value<string>("turnId"), kind), cancellationToken,
                startsTurn: true);

        async Task<TurnResult> WaitCancellable(Turn turn, CancellationToken cancellationToken)
        {
            using (cancellationToken.Register(() => CancelAsync(turn.NpcId).ContinueWith(
                       t => LogLine("oam-bridge: npc/cancel failed: " + t.Exception?.GetBaseException().Message),
                       CancellationToken.None, TaskContinuationOptions.OnlyOnFaulted, TaskScheduler.Default)))
            {
                return await turn.Completion.ConfigureAwait(false);
            }
        }

        /// <summary>
        /// Runs a turn to its end. Cancelling the token sends <c>npc/cancel</c> for the NPC (which
        /// cancels its queued turns too); the task then faults with code <c>cancelled</c>.
        /// </summary>
        public async Task<TurnResult> AskAsync(string npcId, string prompt, RespondOptions options = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            Turn turn = await RespondAsync(npcId, prompt, options, cancellationToken).ConfigureAwait(false);
            return await WaitCancellable(turn, cancellationToken).ConfigureAwait(false);
        }

        /// <summary><c>npc/submit</c> with an output (any JSON; null is JSON null).</summary>
        public Task<bool> SubmitOutputAsync(string npcId, string callId, JToken output,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            var p = new JObject { ["npcId"] = npcId, ["callId"] = callId, ["output"] = output ?? JValue.CreateNull() };
            return Call("npc/submit", p, r => AsObject(r).Value<bool?>("accepted") ?? false, cancellationToken);
        }

        /// <summary><c>npc/submit</c> with an error the model sees as the tool's error.</summary>
        public Task<bool> SubmitErrorAsync(string npcId, string callId, string error,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            var p = new JObject { ["npcId"] = npcId, ["callId"] = callId, ["error"] = error ?? "error" };
            return Call("npc/submit", p, r => AsObject(r).Value<bool?>("accepted") ?? false, cancellationToken);
        }

        /// <summary><c>npc/cancel</c>: cancels the running turn and every queued one; returns their ids.</summary>
        public Task<IReadOnlyList<string>> CancelAsync(string npcId, CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("npc/cancel", NpcRef(npcId),
                r => (IReadOnlyList<string>)((AsObject(r)["cancelled"] as JArray)?.Select(t => (string)t).ToList()
                                             ?? new List<string>()),
                cancellationToken);

        /// <summary><c>npc/transcript</c>: the save; store it as it is and pass it to <see cref="RestoreAsync"/>.</summary>
        public Task<JObject> GetTranscriptAsync(string npcId, CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("npc/transcript", NpcRef(npcId), AsObject, cancellationToken);

        /// <summary><c>npc/restore</c>: creates (or replaces) the NPC from a save, optionally under another id.</summary>
        public Task<RestoreResult> RestoreAsync(JObject save, string npcId = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (save == null) throw new ArgumentNullException(nameof(save));
            var p = new JObject { ["save"] = save.DeepClone() };
            if (npcId != null) p["npcId"] = npcId;
            return Call("npc/restore", p, r => new RestoreResult(AsObject(r)), cancellationToken);
        }

        public Task ResetAsync(string npcId, CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("npc/reset", NpcRef(npcId), r => r, cancellationToken);

        public Task DeleteAsync(string npcId, CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("npc/delete", NpcRef(npcId), r => r, cancellationToken);

        public Task<IReadOnlyList<NpcSummary>> ListAsync(CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("npc/list", null,
                r => (IReadOnlyList<NpcSummary>)((AsObject(r)["npcs"] as JArray)?.OfType<JObject>()
                                                 .Select(n => new NpcSummary(n)).ToList() ?? new List<NpcSummary>()),
                cancellationToken);

        /// <summary><c>tokens/count</c> with an NPC's engine (also reporting its prompt) or a named engine.</summary>
        public Task<TokenCount> CountTokensAsync(string text, string npcId = null, string engine = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            var p = new JObject { ["text"] = text };
            if (npcId != null) p["npcId"] = npcId;
            if (engine != null) p["engine"] = engine;
            return Call("tokens/count", p, r => new TokenCount(AsObject(r)), cancellationToken);
        }

        /// <summary><c>npc/setTags</c>: replaces the NPC's tags; world facts scoped by tag follow from its next model step.</summary>
        public Task SetTagsAsync(string npcId, IEnumerable<string> tags,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (tags == null) throw new ArgumentNullException(nameof(tags));
            var p = new JObject { ["npcId"] = npcId, ["tags"] = new JArray(tags.Cast<object>().ToArray()) };
            return Call("npc/setTags", p, r => r, cancellationToken);
        }

        /// <summary><c>world/set</c>: sets (or replaces, scope included) a world fact; returns the world's new revision.</summary>
        public Task<int> SetWorldFactAsync(WorldFact fact, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (fact == null) throw new ArgumentNullException(nameof(fact));
            return Call("world/set", fact.ToJson(), r => AsObject(r).Value<int?>("revision") ?? 0, cancellationToken);
        }

        /// <summary>
        /// <c>world/set</c> by parts: <paramref name="tags"/> and <paramref name="npcIds"/> both null means
        /// every NPC sees it. A plain string converts to a JToken: <c>SetWorldFactAsync("gate", "closed")</c>.
        /// </summary>
        public Task<int> SetWorldFactAsync(string key, JToken value, IEnumerable<string> tags = null,
            IEnumerable<string> npcIds = null, bool lore = false, CancellationToken cancellationToken = default(CancellationToken)) =>
            SetWorldFactAsync(new WorldFact(key, value) { Tags = tags?.ToList(), NpcIds = npcIds?.ToList(), Lore = lore },
                cancellationToken);

        /// <summary><c>world/delete</c>: <c>Deleted</c> is false when there was no such fact.</summary>
        public Task<WorldDeleteResult> DeleteWorldFactAsync(string key, CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("world/delete", new JObject { ["key"] = key }, r => new WorldDeleteResult(AsObject(r)), cancellationToken);

        /// <summary><c>world/get</c>: every fact, or (with <paramref name="npcId"/>) the facts that NPC can see.</summary>
        public Task<WorldState> GetWorldAsync(string npcId = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            var p = new JObject();
            if (npcId != null) p["npcId"] = npcId;
            return Call("world/get", p, r => new WorldState(AsObject(r)), cancellationToken);
        }

        public Task<EngineStatus> GetEngineStatusAsync(CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("engine/status", null, r => new EngineStatus(AsObject(r)), cancellationToken);

        /// <summary><c>shutdown</c>: ends every turn; afterwards only exit is accepted.</summary>
        public Task ShutdownAsync(CancellationToken cancellationToken = default(CancellationToken)) =>
            Call("shutdown", null, r => r, cancellationToken);

        /// <summary>
        /// Sends <c>exit</c>, closes stdin and waits for the process to end (killing it after
        /// <paramref name="timeout"/>, default 5 s). Returns the exit code.
        /// </summary>
        public async Task<int> ExitAsync(TimeSpan? timeout = null)
        {
            Notify("exit");
            CloseInput();
            var limit = timeout ?? TimeSpan.FromSeconds(5);
            if (await Task.WhenAny(_exited.Task, Task.Delay(limit)).ConfigureAwait(false) != _exited.Task)
            {
                LogLine("oam-bridge: did not exit within " + limit + "; killing it");
                Kill();
            }
            return await _exited.Task.ConfigureAwait(false);
        }

        /// <summary>
        /// Closes stdin (the bridge cancels its turns and exits within a second) without blocking;
        /// kills the process if it is still running 3 s later. Pending requests fault when its
        /// output ends.
        /// </summary>
        public void Dispose()
        {
            if (Interlocked.Exchange(ref _disposed, 1) == 1) return;
            CloseInput();
            Task.Delay(3000).ContinueWith(_ =>
            {
                if (!_exited.Task.IsCompleted) Kill();
            }, TaskScheduler.Default);
        }

        /// <summary>Any request by name (e.g. a newer bridge's method); the raw <c>result</c>.</summary>
        public Task<JToken> RequestAsync(string method, JObject parameters = null,
            CancellationToken cancellationToken = default(CancellationToken)) =>
            Call(method, parameters, r => r, cancellationToken);

        /// <summary>A notification (no response).</summary>
        public void Notify(string method, JObject parameters = null)
        {
            var msg = new JObject { ["jsonrpc"] = "2.0", ["method"] = method };
            if (parameters != null) msg["params"] = parameters;
            Enqueue(msg.ToString(Formatting.None));
        }

        // ------------------------------------------------------------------ requests

        abstract class Pending
        {
            public CancellationTokenRegistration Registration;
            public bool StartsTurn;
            public abstract void Complete(JToken result); // on the reader thread
            public abstract void Fail(Exception error);
            public abstract void Cancel(CancellationToken token);
        }

        sealed class Pending<T> : Pending
        {
            readonly Func<JToken, T> _map;
            public readonly TaskCompletionSource<T> Tcs =
                new TaskCompletionSource<T>(TaskCreationOptions.RunContinuationsAsynchronously);

            public Pending(Func<JToken, T> map) { _map = map; }

            public override void Complete(JToken result)
            {
                T value;
                try { value = _map(result); }
                catch (Exception e)
                {
                    Tcs.TrySetException(new OamBridgeException(ErrorCodes.InternalError, ErrorCodes.InternalErrorRpc,
                        "unexpected result from the bridge: " + e.Message, false, null, e));
                    return;
                }
                Tcs.TrySetResult(value);
            }

            public override void Fail(Exception error) => Tcs.TrySetException(error);
            public override void Cancel(CancellationToken token) => Tcs.TrySetCanceled(token);
        }

        Task<T> Call<T>(string method, JObject parameters, Func<JToken, T> map, CancellationToken cancellationToken,
            bool startsTurn = false)
        {
            var pending = new Pending<T>(map) { StartsTurn = startsTurn };
            if (cancellationToken.IsCancellationRequested)
            {
                pending.Cancel(cancellationToken);
                return pending.Tcs.Task;
            }
            long id = Interlocked.Increment(ref _nextId);
            var msg = new JObject { ["jsonrpc"] = "2.0", ["id"] = id, ["method"] = method };
            if (parameters != null) msg["params"] = parameters;
            lock (_gate)
            {
                if (_closed != null)
                {
                    pending.Fail(_closed);
                    return pending.Tcs.Task;
                }
                _pending[id] = pending;
                if (startsTurn) _respondsInFlight++;
            }
            if (cancellationToken.CanBeCanceled)
                pending.Registration = cancellationToken.Register(() =>
                {
                    if (TakePending(id) == null) return;
                    pending.Cancel(cancellationToken);
                    Resolved(pending);
                });
            if (!Enqueue(msg.ToString(Formatting.None)) && TakePending(id) != null)
            {
                pending.Fail(OamBridgeException.TransportError(
                    method + ": the bridge's stdin is closed (ExitAsync or Dispose was called)"));
                Resolved(pending);
            }
            return pending.Tcs.Task;
        }

        Pending TakePending(long id)
        {
            lock (_gate)
            {
                if (!_pending.TryGetValue(id, out var p)) return null;
                _pending.Remove(id);
                return p;
            }
        }

        // after a pending request got its answer: early events nobody can claim any more are dropped
        void Resolved(Pending pending)
        {
            if (!pending.StartsTurn) return;
            lock (_gate)
            {
                if (_closed != null || --_respondsInFlight > 0) return;
                _early.Clear();
                _earlyCount = 0;
            }
        }

        bool Enqueue(string line)
        {
            try
            {
                _outbox.Add(line);
                return true;
            }
            catch (InvalidOperationException) // adding completed: stdin closed
            {
                return false;
            }
        }

        void CloseInput()
        {
            try { _outbox.CompleteAdding(); }
            catch (ObjectDisposedException) { }
        }

        void Kill()
        {
            if (_exited.Task.IsCompleted) return;
            try
            {
                if (!_process.HasExited) _process.Kill();
            }
            catch (InvalidOperationException) { /* exited meanwhile */ }
            catch (Exception e) { LogLine("oam-bridge: kill failed: " + e.Message); }
        }

        static JObject NpcRef(string npcId) => new JObject { ["npcId"] = npcId };

        static JObject AsObject(JToken t) =>
            t as JObject ?? throw new FormatException("expected an object, got " + (t?.Type.ToString() ?? "nothing"));

        // ------------------------------------------------------------------ threads

        static Thread StartThread(ThreadStart body, string name)
        {
            var thread = new Thread(body) { IsBackground = true, Name = name };
            thread.Start();
            return thread;
        }

        void WriteLoop()
        {
            try
            {
                Stream stdin = _process.StandardInput.BaseStream; // raw bytes: no BOM, "\n" only
                foreach (string line in _outbox.GetConsumingEnumerable())
                {
                    byte[] bytes = Utf8NoBom.GetBytes(line + "\n");
                    stdin.Write(bytes, 0, bytes.Length);
                    if (_outbox.Count == 0) stdin.Flush();
                }
            }
            catch (Exception e)
            {
                LogLine("oam-bridge: writing to the bridge failed: " + e.Message);
                CloseTransport(OamBridgeException.TransportError("writing to the bridge failed: " + e.Message, e));
            }
            finally
            {
                try { _process.StandardInput.Close(); }
                catch (Exception) { /* already broken */ }
            }
        }

        void ReadLoop()
        {
            string reason = "the bridge closed its output";
            try
            {
                StreamReader stdout = _process.StandardOutput;
                string line;
                while ((line = stdout.ReadLine()) != null)
                {
                    if (line.Trim().Length == 0) continue;
                    HandleLine(line);
                }
            }
            catch (Exception e)
            {
                reason = "reading from the bridge failed: " + e.Message;
                LogLine("oam-bridge: " + reason);
            }
            try
            {
                // the bridge exits right after closing its output: wait a little for the code,
                // but fail what is pending even if the process lingers
                if (_process.WaitForExit(2000))
                    reason += " (exit code " + _process.ExitCode + ")";
                CloseTransport(OamBridgeException.TransportError(reason));
                _process.WaitForExit();
                int code = _process.ExitCode;
                _stderrThread.Join(1000);
                _exited.TrySetResult(code);
                _process.Dispose();
            }
            catch (Exception e)
            {
                CloseTransport(OamBridgeException.TransportError(reason, e));
                _exited.TrySetException(e);
            }
            CloseInput();
        }

        void ErrorLoop()
        {
            try
            {
                string line;
                while ((line = _process.StandardError.ReadLine()) != null) LogLine(line);
            }
            catch (Exception e) { LogLine("oam-bridge: reading stderr failed: " + e.Message); }
        }

        /// <summary>Fails every pending request and running turn; later requests fault at once.</summary>
        void CloseTransport(OamBridgeException error)
        {
            List<Pending> pending;
            List<Turn> turns;
            lock (_gate)
            {
                if (_closed != null) return;
                Volatile.Write(ref _closed, error);
                pending = _pending.Values.ToList();
                _pending.Clear();
                turns = _turns.Values.ToList();
                _turns.Clear();
                _early.Clear();
                _earlyCount = 0;
                _respondsInFlight = 0;
            }
            CloseInput();
            foreach (var p in pending)
            {
                p.Registration.Dispose();
                p.Fail(error);
            }
            foreach (var t in turns) Post(() => t.Fail(error));
        }

        // ------------------------------------------------------------------ incoming messages

        void HandleLine(string line)
        {
            JToken message;
            try { message = ParseJson(line); }
            catch (JsonException e)
            {
                LogLine("oam-bridge: unreadable line from the bridge (" + e.Message + "): " + line);
                return;
            }
            if (message is JArray batch)
                foreach (var m in batch) HandleMessage(m as JObject, line);
            else
                HandleMessage(message as JObject, line);
        }

        /// <summary>Parses JSON as the bridge wrote it: strings stay strings (no date guessing), no depth limit.</summary>
        internal static JToken ParseJson(string text)
        {
            using (var reader = new JsonTextReader(new StringReader(text)))
            {
                reader.DateParseHandling = DateParseHandling.None;
                reader.MaxDepth = null;
                JToken token = JToken.ReadFrom(reader);
                if (reader.Read() && reader.TokenType != JsonToken.Comment)
                    throw new JsonReaderException("trailing data after the JSON value");
                return token;
            }
        }

        void HandleMessage(JObject msg, string line)
        {
            if (msg == null)
            {
                LogLine("oam-bridge: not a JSON-RPC message: " + line);
                return;
            }
            if (msg["method"] is JValue method && method.Type == JTokenType.String)
            {
                HandleNotification((string)method, msg["params"] as JObject ?? new JObject());
                return;
            }
            JToken idToken = msg["id"];
            if (idToken == null || idToken.Type != JTokenType.Integer)
            {
                // e.g. a parse_error or message_too_large answered with id null
                LogLine("oam-bridge: response without a request: " + line);
                return;
            }
            Pending pending = TakePending((long)idToken);
            if (pending == null) return; // cancelled by the caller; the answer is dropped
            pending.Registration.Dispose();
            if (msg["error"] is JObject error) pending.Fail(OamBridgeException.FromRpcError(error));
            else pending.Complete(msg["result"] ?? JValue.CreateNull());
            Resolved(pending);
        }

        // on the reader thread, from StartTurn's result mapping
        Turn ClaimTurn(string npcId, string turnId, string kind)
        {
            if (string.IsNullOrEmpty(turnId)) throw new FormatException("npc/" + kind + " returned no turnId");
            var turn = new Turn(this, npcId, turnId, kind);
            List<TurnEvent> early;
            lock (_gate)
            {
                if (_early.TryGetValue(turnId, out early))
                {
                    _early.Remove(turnId);
                    _earlyCount -= early.Count;
                }
                if (early == null || !early.Any(e => e.IsTerminal)) _turns[turnId] = turn;
            }
            if (early != null)
                foreach (var e in early)
                    Post(() => { turn.Apply(e); if (e.IsTerminal) turn.Finish(e); });
            return turn;
        }

        void HandleNotification(string method, JObject p)
        {
            if (!method.StartsWith("turn/", StringComparison.Ordinal))
            {
                LogLine("oam-bridge: unknown notification " + method);
                return;
            }
            TurnEvent ev = TurnEvent.Create(method, p);
            Turn turn = null;
            if (ev.TurnId != null)
            {
                lock (_gate)
                {
                    if (_turns.TryGetValue(ev.TurnId, out turn))
                    {
                        if (ev.IsTerminal) _turns.Remove(ev.TurnId);
                    }
                    else if (_respondsInFlight > 0)
                    {
                        // a response may still be on its way; keep the event for the handle
                        if (!_early.TryGetValue(ev.TurnId, out var list)) _early[ev.TurnId] = list = new List<TurnEvent>();
                        if (_earlyCount < MaxEarlyEvents || ev.IsTerminal)
                        {
                            list.Add(ev);
                            _earlyCount++;
                        }
                    }
                }
            }
            Post(() => Deliver(ev, turn));
        }

        // on the dispatch thread
        void Deliver(TurnEvent ev, Turn turn)
        {
            turn?.Apply(ev);
            Raise(EventReceived, ev);
            if (ev is TurnStartedEvent started) Raise(TurnStarted, started);
            else if (ev is TextDeltaEvent delta) Raise(TextDelta, delta);
            else if (ev is PartialJsonEvent json) Raise(PartialJson, json);
            else if (ev is ToolCallRequestedEvent call)
            {
                Raise(ToolCallRequested, call);
                RunTool(call);
            }
            else if (ev is ToolCallCompletedEvent callDone) Raise(ToolCallCompleted, callDone);
            else if (ev is ToolCallWithdrawnEvent withdrawn) Raise(ToolCallWithdrawn, withdrawn);
            else if (ev is ContextTrimmedEvent trimmed) Raise(ContextTrimmed, trimmed);
            else if (ev is TurnCompletedEvent completed) Raise(Completed, completed);
            else if (ev is TurnFailedEvent failed) Raise(Failed, failed);
            if (ev.IsTerminal) turn?.Finish(ev);
        }

        void RunTool(ToolCallRequestedEvent call)
        {
            if (!_tools.TryGetValue(ToolKey(call.NpcId, call.Name), out var handler)
                && !_tools.TryGetValue(ToolKey(null, call.Name), out handler))
                return;
            Task<JToken> run;
            try { run = handler(call.Arguments) ?? Task.FromResult<JToken>(JValue.CreateNull()); }
            catch (Exception e)
            {
                var failed = new TaskCompletionSource<JToken>();
                failed.SetException(e);
                run = failed.Task;
            }
            run.ContinueWith(t =>
            {
                bool ok = t.Status == TaskStatus.RanToCompletion;
                JToken output = ok ? t.Result ?? JValue.CreateNull() : null;
                string error = ok ? null
                    : t.IsCanceled ? "the tool was cancelled"
                    : t.Exception?.GetBaseException().Message ?? "tool failed";
                Task<bool> submit = ok
                    ? SubmitOutputAsync(call.NpcId, call.CallId, output)
                    : SubmitErrorAsync(call.NpcId, call.CallId, error);
                submit.ContinueWith(s =>
                {
                    Exception failure = s.IsFaulted ? s.Exception?.GetBaseException() : null;
                    if (failure != null)
                        LogLine("oam-bridge: submitting " + call.Name + " " + call.CallId + " failed: " + failure.Message);
                    var submission = new ToolCallSubmission(call, output, error, s.Status == TaskStatus.RanToCompletion && s.Result, failure);
                    Post(() => Raise(ToolCallSubmitted, submission));
                }, CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
            }, CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
        }

        // ------------------------------------------------------------------ dispatch

        void Post(Action action)
        {
            Action safe = () =>
            {
                try { action(); }
                catch (Exception e) { ReportHandlerError(e); }
            };
            Action<Action> dispatch = Dispatch;
            if (dispatch == null)
            {
                safe();
                return;
            }
            try { dispatch(safe); }
            catch (Exception e) { ReportHandlerError(e); }
        }

        void Raise<T>(Action<T> handlers, T ev)
        {
            if (handlers == null) return;
            foreach (Action<T> h in handlers.GetInvocationList())
            {
                try { h(ev); }
                catch (Exception e) { ReportHandlerError(e); }
            }
        }

        void ReportHandlerError(Exception e)
        {
            try { Log?.Invoke("oam-bridge: an event handler threw: " + e); }
            catch (Exception) { /* the log handler itself threw: nowhere left to report */ }
        }

        void LogLine(string line) => Post(() => Log?.Invoke(line));
    }
}
