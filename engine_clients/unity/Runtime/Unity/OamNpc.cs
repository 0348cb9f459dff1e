using System;
using System.Collections.Generic;
using System.IO;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Newtonsoft.Json.Linq;
using UnityEngine;
using UnityEngine.Events;

namespace Oam.Bridge.Unity
{
    [Serializable]
    public sealed class OamToolSpec
    {
        public string name;
        public string description;
        [Tooltip("JSON Schema of the arguments")]
        [TextArea] public string parametersJson = "{\"type\":\"object\"}";
    }

    [Serializable] public sealed class OamStringEvent : UnityEvent<string> { }

    /// <summary>
    /// An NPC backed by oam-bridge. Created on the bridge in <c>Start</c> (or on the first
    /// <see cref="SayAsync"/>); deleted, and the shared bridge released, in <c>OnDestroy</c> /
    /// <c>OnApplicationQuit</c>. Events and tool handlers run on the main thread. If the start
    /// fails, or the bridge exits or crashes, the next call starts it again (and creates the NPC
    /// again from its settings: its history is lost unless you saved it with <see cref="SaveHistoryAsync"/>).
    /// </summary>
    public class OamNpc : MonoBehaviour
    {
        [Header("Bridge process")]
        [Tooltip("Empty: the shipped bridge (StreamingAssets/oam-bridge/<platform>/oam-bridge[.exe]); in the editor "
                 + "the project's OamBridge/<platform> dist, else `python -m bridge`. Set: this exact command.")]
        public string bridgeExecutable = "";
        [Tooltip("Arguments for the bridge, e.g. --engine scripted (with a custom executable: its whole argument line)")]
        public string bridgeArguments = "";
        [Tooltip("Empty: the current directory (the shipped bridge runs in its own folder)")]
        public string bridgeWorkingDirectory = "";
        [Tooltip("Editor fallback when no dist is found: this Python (empty: python3, or python on Windows) runs -m bridge")]
        public string editorPython = "";

        [Header("NPC")]
        [Tooltip("Empty: unique per component (the GameObject's name plus a random suffix). Set it for saves you load by id.")]
        public string npcId = "";
        [Tooltip("auto, scripted, llama or native")]
        public string engine = "auto";
        [TextArea] public string instructions = "";
        public string personaName = "";
        public string role = "";
        public string[] traits = new string[0];
        public string speechStyle = "";
        public OamToolSpec[] tools = new OamToolSpec[0];
        [Tooltip("Where it is, whose side it is on: world facts scoped by these tags reach this NPC")]
        public string[] tags = new string[0];

        [Header("Guardrails")]
        [Tooltip("What SayAsync does when the model's guardrails block a turn or it refuses")]
        public GuardrailPolicy guardrail = GuardrailPolicy.Fail;
        [Tooltip("Said instead of a line the guardrails blocked (Fallback / Retry), in turn")]
        public string[] guardrailFallbackLines = new string[0];
        [Tooltip("Said instead of a refusal (Fallback / Retry), in turn")]
        public string[] refusalFallbackLines = new string[0];

        [Tooltip("Prewarm the NPC right after it is created, so its first words come sooner")]
        public bool prewarmOnStart;
        [Tooltip("For tests without a model: the scripted engine's steps (a JSON array, protocol.md), with engine = scripted")]
        [TextArea] public string scriptJson = "";

        [Header("Events (main thread)")]
        public OamStringEvent onTextDelta = new OamStringEvent();
        public OamStringEvent onTurnCompleted = new OamStringEvent();
        public OamStringEvent onTurnFailed = new OamStringEvent();

        /// <summary>A turn of this NPC started: its <c>Kind</c> (respond, decide, prewarm) and <c>Speaker</c>.</summary>
        public event Action<TurnStartedEvent> TurnStarted;
        /// <summary>Each streamed piece of text of this NPC's turns.</summary>
        public event Action<TextDeltaEvent> TextDelta;
        public event Action<TurnResult> TurnCompleted;
        public event Action<TurnFailedEvent> TurnFailed;

        /// <summary>The shared client, once <see cref="ReadyAsync"/> has completed.</summary>
        public OamBridgeClient Client { get; private set; }

        readonly Dictionary<string, Func<JToken, Task<JToken>>> _handlers = new Dictionary<string, Func<JToken, Task<JToken>>>();
        readonly CancellationTokenSource _lifetime = new CancellationTokenSource();
        Task _ready;
        bool _closed;
        string _id;

        /// <summary>
        /// The id this NPC has on the bridge: <see cref="npcId"/>, or when that is empty one made once per
        /// component from the GameObject's name and a random suffix, so two default components never collide.
        /// </summary>
        public string NpcId => _id ?? (_id = string.IsNullOrEmpty(npcId)
            ? name + "-" + Guid.NewGuid().ToString("N").Substring(0, 8) : npcId);

        /// <summary>Answers this NPC's calls of tool <paramref name="name"/> (main thread); the result is submitted.</summary>
        public void RegisterTool(string name, Func<JToken, Task<JToken>> handler)
        {
            _handlers[name] = handler;
            Client?.RegisterTool(NpcId, name, handler);
        }

        public void RegisterTool(string name, Func<JToken, JToken> handler) =>
            RegisterTool(name, args => Task.FromResult(handler(args)));

        /// <summary>
        /// Starts the bridge (shared) and creates the NPC. Done once; but after a failed start, or once
        /// the bridge has exited or crashed, the next call starts it (and creates the NPC) again.
        /// </summary>
        public Task ReadyAsync()
        {
            if (_closed) return Task.FromException(new ObjectDisposedException(nameof(OamNpc), "OamNpc destroyed"));
            if (_ready != null && (_ready.IsFaulted || _ready.IsCanceled
                                   || (_ready.IsCompleted && (Client == null || !Client.IsRunning))))
            {
                Detach();
                _ready = null;
            }
            return _ready ?? (_ready = CreateAsync());
        }

        /// <summary>Runs one turn and returns the NPC's answer. The token (and destroying the component) cancels it.</summary>
        public async Task<string> SayAsync(string prompt, CancellationToken cancellationToken = default(CancellationToken))
        {
            TurnResult result = await SayAsync(prompt, new RespondOptions(), cancellationToken);
            return result.Text;
        }

        /// <summary>
        /// Runs one turn with <paramref name="options"/> and returns the whole result (<c>FinishReason</c>,
        /// <c>WorldRevision</c>, ...). The component's <see cref="guardrail"/> applies unless the options set one.
        /// </summary>
        public async Task<TurnResult> SayAsync(string prompt, RespondOptions options,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            await ReadyAsync();
            options = options ?? new RespondOptions();
            if (!options.Guardrail.HasValue && guardrail != GuardrailPolicy.Fail) options.Guardrail = guardrail;
            using (var both = CancellationTokenSource.CreateLinkedTokenSource(cancellationToken, _lifetime.Token))
            {
                return await Client.AskAsync(NpcId, prompt, options, both.Token);
            }
        }

        /// <summary>
        /// This NPC answers another NPC: <paramref name="speaker"/> says <paramref name="line"/> (the model
        /// reads it as <c>Name: line</c>, the name being the speaker's persona name or id).
        /// </summary>
        public async Task<string> ReplyToAsync(OamNpc speaker, string line,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (speaker == null) throw new ArgumentNullException(nameof(speaker));
            TurnResult result = await SayAsync(line, new RespondOptions { Speaker = speaker.NpcId }, cancellationToken);
            return result.Text;
        }

        /// <summary>The NPC picks one of <paramref name="choices"/> for <paramref name="situation"/> (<c>npc/decide</c>).</summary>
        public async Task<Decision> DecideAsync(string situation, IEnumerable<DecisionOption> choices,
            DecideOptions options = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            await ReadyAsync();
            using (var both = CancellationTokenSource.CreateLinkedTokenSource(cancellationToken, _lifetime.Token))
            {
                return await Client.ChooseAsync(NpcId, situation, choices, options, both.Token);
            }
        }

        /// <summary>
        /// Prepares the NPC before the player reaches it (<c>npc/prewarm</c>); completes when it is done.
        /// <paramref name="speaker"/>: who speaks to it next (another NPC's id, e.g. <c>greta.NpcId</c>, or a
        /// name; null or empty: the player); <paramref name="promptPrefix"/>: how that line starts, when the game knows.
        /// </summary>
        public async Task PrewarmAsync(string speaker = null, string promptPrefix = null)
        {
            await ReadyAsync();
            Turn turn = await Client.PrewarmAsync(NpcId, string.IsNullOrEmpty(speaker) ? null : speaker,
                string.IsNullOrEmpty(promptPrefix) ? null : promptPrefix);
            await turn.Completion;
        }

        /// <summary>Replaces the NPC's tags (<c>npc/setTags</c>), e.g. when it walks into the tavern.</summary>
        public async Task SetTagsAsync(params string[] newTags)
        {
            tags = newTags ?? new string[0];
            await ReadyAsync();
            await Client.SetTagsAsync(NpcId, tags);
        }

        /// <summary>This NPC's history as a string (the bridge's <c>npc/transcript</c> save, JSON): keep it in your save game.</summary>
        public async Task<string> SaveHistoryAsync(CancellationToken cancellationToken = default(CancellationToken))
        {
            await ReadyAsync();
            JObject save = await Client.GetTranscriptAsync(NpcId, cancellationToken);
            return save.ToString(Newtonsoft.Json.Formatting.None);
        }

        /// <summary>
        /// Replaces this NPC with a save from <see cref="SaveHistoryAsync"/> (<c>npc/restore</c> under this
        /// component's <see cref="NpcId"/>): its history and the settings it was saved with. Returns the
        /// number of turns restored.
        /// </summary>
        public async Task<int> LoadHistoryAsync(string save, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (string.IsNullOrEmpty(save)) throw new ArgumentException("empty save", nameof(save));
            JObject parsed = JObject.Parse(save);
            await ReadyAsync();
            RestoreResult result = await Client.RestoreAsync(parsed, NpcId, cancellationToken);
            return result.Turns;
        }

        /// <summary>
        /// Writes <see cref="SaveHistoryAsync"/> to <paramref name="path"/> (UTF-8; written to a temporary
        /// file first, then moved, so a crash never leaves half a save). Null: the default path,
        /// <see cref="DefaultSavePath"/>. Returns the path.
        /// </summary>
        public async Task<string> SaveHistoryToFileAsync(string path = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            path = path ?? DefaultSavePath();
            string json = await SaveHistoryAsync(cancellationToken);
            string dir = Path.GetDirectoryName(Path.GetFullPath(path));
            if (!string.IsNullOrEmpty(dir)) Directory.CreateDirectory(dir);
            string tmp = path + ".tmp";
            File.WriteAllText(tmp, json, new UTF8Encoding(false));
            if (File.Exists(path)) File.Delete(path);
            File.Move(tmp, path);
            return path;
        }

        /// <summary>Loads a file written by <see cref="SaveHistoryToFileAsync"/> (null: <see cref="DefaultSavePath"/>).</summary>
        public Task<int> LoadHistoryFromFileAsync(string path = null,
            CancellationToken cancellationToken = default(CancellationToken)) =>
            LoadHistoryAsync(File.ReadAllText(path ?? DefaultSavePath(), Encoding.UTF8), cancellationToken);

        /// <summary>
        /// <c>Application.persistentDataPath/oam-bridge/&lt;npcId&gt;.json</c>. Needs <see cref="npcId"/> set:
        /// a generated id changes every run, so a save under it could not be found again.
        /// </summary>
        public string DefaultSavePath()
        {
            if (string.IsNullOrEmpty(npcId))
                throw new InvalidOperationException("OamNpc " + name + ": set npcId to save or load by the default path "
                                                    + "(the generated id changes every run), or pass a path");
            foreach (char c in Path.GetInvalidFileNameChars())
                if (npcId.IndexOf(c) >= 0) throw new InvalidOperationException("npcId " + npcId + " is not a file name; pass a path");
            return Path.Combine(Application.persistentDataPath, "oam-bridge", npcId + ".json");
        }

        async void Start()
        {
            try { await ReadyAsync(); }
            catch (Exception e)
            {
                if (!_closed) Debug.LogException(e, this); // destroyed while starting: nothing to report
            }
        }

        async Task CreateAsync()
        {
            OamBridgeCommand command = OamBridgeLocation.Resolve(bridgeExecutable, bridgeArguments, bridgeWorkingDirectory, editorPython);
            OamBridgeClient client = await OamBridgeHost.AcquireAsync(command.Executable, command.Arguments, command.WorkingDirectory);
            if (_closed) // destroyed while the bridge started
            {
                OamBridgeHost.Release(client);
                throw new OperationCanceledException("OamNpc destroyed");
            }
            Client = client;
            client.TurnStarted += OnTurnStarted;
            client.TextDelta += OnTextDelta;
            client.Completed += OnCompleted;
            client.Failed += OnFailed;
            foreach (var kv in _handlers) client.RegisterTool(NpcId, kv.Key, kv.Value);
            await client.CreateNpcAsync(BuildConfig());
            if (prewarmOnStart) await client.PrewarmAsync(NpcId); // accepted; it runs before the first turn
        }

        NpcConfig BuildConfig()
        {
            var config = new NpcConfig(NpcId)
            {
                Engine = string.IsNullOrEmpty(engine) ? null : engine,
                Instructions = string.IsNullOrEmpty(instructions) ? null : instructions,
            };
            if (!string.IsNullOrEmpty(personaName))
                config.Persona = new Persona(personaName) { Role = role, Traits = traits ?? new string[0], SpeechStyle = speechStyle };
            config.Tags = tags ?? new string[0];
            if ((guardrailFallbackLines?.Length ?? 0) > 0 || (refusalFallbackLines?.Length ?? 0) > 0)
                config.Fallbacks = new NpcFallbacks
                {
                    GuardrailViolation = guardrailFallbackLines ?? new string[0],
                    Refusal = refusalFallbackLines ?? new string[0],
                };
            foreach (var tool in tools ?? new OamToolSpec[0])
                config.Tools.Add(new ToolDefinition(tool.name, tool.description,
                    string.IsNullOrEmpty(tool.parametersJson) ? null : JObject.Parse(tool.parametersJson)));
            if (!string.IsNullOrEmpty(scriptJson)) config.Script = JArray.Parse(scriptJson);
            return config;
        }

        void OnTurnStarted(TurnStartedEvent e)
        {
            if (e.NpcId != NpcId) return;
            TurnStarted?.Invoke(e);
        }

        void OnTextDelta(TextDeltaEvent e)
        {
            if (e.NpcId != NpcId) return;
            TextDelta?.Invoke(e);
            onTextDelta.Invoke(e.Delta);
        }

        void OnCompleted(TurnCompletedEvent e)
        {
            if (e.NpcId != NpcId) return;
            TurnCompleted?.Invoke(e.Result);
            onTurnCompleted.Invoke(e.Result.Text);
        }

        void OnFailed(TurnFailedEvent e)
        {
            if (e.NpcId != NpcId) return;
            TurnFailed?.Invoke(e);
            onTurnFailed.Invoke(e.Code);
        }

        void OnApplicationQuit() => Close();

        void OnDestroy() => Close();

        void Close()
        {
            if (_closed) return;
            _closed = true;
            _lifetime.Cancel();
            Detach(); // a start still in flight releases its bridge itself when it sees _closed
        }

        // lets go of the bridge: events, tools, the NPC on the bridge, and this component's reference
        void Detach()
        {
            OamBridgeClient client = Client;
            Client = null;
            if (client == null) return;
            client.TurnStarted -= OnTurnStarted;
            client.TextDelta -= OnTextDelta;
            client.Completed -= OnCompleted;
            client.Failed -= OnFailed;
            foreach (var tool in _handlers.Keys) client.UnregisterTool(NpcId, tool);
            if (client.IsRunning) _ = client.DeleteAsync(NpcId); // queued before stdin closes; no wait
            OamBridgeHost.Release(client);
        }
    }
}
