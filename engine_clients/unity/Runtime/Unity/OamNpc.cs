using System;
using System.Collections.Generic;
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
    /// <c>OnApplicationQuit</c>. Events and tool handlers run on the main thread.
    /// </summary>
    public class OamNpc : MonoBehaviour
    {
        [Header("Bridge process")]
        public string bridgeExecutable = "python";
        public string bridgeArguments = "-m bridge";
        [Tooltip("Empty: the current directory")]
        public string bridgeWorkingDirectory = "";

        [Header("NPC")]
        public string npcId = "npc";
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

        /// <summary>Answers this NPC's calls of tool <paramref name="name"/> (main thread); the result is submitted.</summary>
        public void RegisterTool(string name, Func<JToken, Task<JToken>> handler)
        {
            _handlers[name] = handler;
            Client?.RegisterTool(npcId, name, handler);
        }

        public void RegisterTool(string name, Func<JToken, JToken> handler) =>
            RegisterTool(name, args => Task.FromResult(handler(args)));

        /// <summary>Starts the bridge (shared) and creates the NPC, once.</summary>
        public Task ReadyAsync() => _ready ?? (_ready = CreateAsync());

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
                return await Client.AskAsync(npcId, prompt, options, both.Token);
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
            TurnResult result = await SayAsync(line, new RespondOptions { Speaker = speaker.npcId }, cancellationToken);
            return result.Text;
        }

        /// <summary>The NPC picks one of <paramref name="choices"/> for <paramref name="situation"/> (<c>npc/decide</c>).</summary>
        public async Task<Decision> DecideAsync(string situation, IEnumerable<DecisionOption> choices,
            DecideOptions options = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            await ReadyAsync();
            using (var both = CancellationTokenSource.CreateLinkedTokenSource(cancellationToken, _lifetime.Token))
            {
                return await Client.ChooseAsync(npcId, situation, choices, options, both.Token);
            }
        }

        /// <summary>Prepares the NPC before the player reaches it (<c>npc/prewarm</c>); completes when it is done.</summary>
        public async Task PrewarmAsync()
        {
            await ReadyAsync();
            Turn turn = await Client.PrewarmAsync(npcId);
            await turn.Completion;
        }

        /// <summary>Replaces the NPC's tags (<c>npc/setTags</c>), e.g. when it walks into the tavern.</summary>
        public async Task SetTagsAsync(params string[] newTags)
        {
            tags = newTags ?? new string[0];
            await ReadyAsync();
            await Client.SetTagsAsync(npcId, tags);
        }

        async void Start()
        {
            try { await ReadyAsync(); }
            catch (Exception e) { Debug.LogException(e, this); }
        }

        async Task CreateAsync()
        {
            OamBridgeClient client = await OamBridgeHost.AcquireAsync(bridgeExecutable, bridgeArguments, bridgeWorkingDirectory);
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
            foreach (var kv in _handlers) client.RegisterTool(npcId, kv.Key, kv.Value);
            await client.CreateNpcAsync(BuildConfig());
            if (prewarmOnStart) await client.PrewarmAsync(npcId); // accepted; it runs before the first turn
        }

        NpcConfig BuildConfig()
        {
            var config = new NpcConfig(npcId)
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
            return config;
        }

        void OnTurnStarted(TurnStartedEvent e)
        {
            if (e.NpcId != npcId) return;
            TurnStarted?.Invoke(e);
        }

        void OnTextDelta(TextDeltaEvent e)
        {
            if (e.NpcId != npcId) return;
            TextDelta?.Invoke(e);
            onTextDelta.Invoke(e.Delta);
        }

        void OnCompleted(TurnCompletedEvent e)
        {
            if (e.NpcId != npcId) return;
            TurnCompleted?.Invoke(e.Result);
            onTurnCompleted.Invoke(e.Result.Text);
        }

        void OnFailed(TurnFailedEvent e)
        {
            if (e.NpcId != npcId) return;
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
            OamBridgeClient client = Client;
            Client = null;
            if (client == null) return;
            client.TurnStarted -= OnTurnStarted;
            client.TextDelta -= OnTextDelta;
            client.Completed -= OnCompleted;
            client.Failed -= OnFailed;
            foreach (var name in _handlers.Keys) client.UnregisterTool(npcId, name);
            if (client.IsRunning) _ = client.DeleteAsync(npcId); // queued before stdin closes; no wait
            OamBridgeHost.Release(client);
        }
    }
}
