using Newtonsoft.Json.Linq;

namespace Oam.Bridge
{
    /// <summary>A <c>turn/*</c> notification. Every one carries <see cref="NpcId"/>, <see cref="TurnId"/>
    /// and <see cref="Seq"/> (0, 1, 2, ... per turn, without gaps).</summary>
    public class TurnEvent
    {
        internal TurnEvent(string method, JObject p)
        {
            Method = method;
            Params = p;
            NpcId = p.Value<string>("npcId");
            TurnId = p.Value<string>("turnId");
            Seq = p.Value<int?>("seq") ?? -1;
        }

        /// <summary>The notification method, e.g. <c>turn/textDelta</c>.</summary>
        public string Method { get; }
        public string NpcId { get; }
        public string TurnId { get; }
        public int Seq { get; }
        /// <summary>The params as received.</summary>
        public JObject Params { get; }

        /// <summary>True for <c>turn/completed</c> and <c>turn/failed</c>: nothing of the turn follows.</summary>
        public bool IsTerminal => this is TurnCompletedEvent || this is TurnFailedEvent;

        internal static TurnEvent Create(string method, JObject p)
        {
            switch (method)
            {
                case "turn/started": return new TurnStartedEvent(method, p);
                case "turn/textDelta": return new TextDeltaEvent(method, p);
                case "turn/partialJson": return new PartialJsonEvent(method, p);
                case "turn/toolCallRequested": return new ToolCallRequestedEvent(method, p);
                case "turn/toolCallCompleted": return new ToolCallCompletedEvent(method, p);
                case "turn/toolCallWithdrawn": return new ToolCallWithdrawnEvent(method, p);
                case "turn/contextTrimmed": return new ContextTrimmedEvent(method, p);
                case "turn/completed": return new TurnCompletedEvent(method, p);
                case "turn/failed": return new TurnFailedEvent(method, p);
                default: return new TurnEvent(method, p); // a newer bridge's event: still delivered
            }
        }
    }

    public sealed class TurnStartedEvent : TurnEvent
    {
        internal TurnStartedEvent(string m, JObject p) : base(m, p)
        {
            Prompt = p.Value<string>("prompt");
            Speaker = p.Value<string>("speaker");
            Kind = p.Value<string>("kind") ?? TurnKinds.Respond;
        }

        /// <summary>The player's line (a decision: the text the model reads; a prewarm: its <c>promptPrefix</c>, <c>""</c> without one).</summary>
        public string Prompt { get; }
        /// <summary>Who said the prompt: null for the player, else the speaker's name (another NPC's persona name or id).</summary>
        public string Speaker { get; }
        /// <summary><c>respond</c>, <c>decide</c> or <c>prewarm</c> (<see cref="TurnKinds"/>): the method that started the turn.</summary>
        public string Kind { get; }
    }

    public sealed class TextDeltaEvent : TurnEvent
    {
        internal TextDeltaEvent(string m, JObject p) : base(m, p)
        {
            Delta = p.Value<string>("delta") ?? "";
            Text = p.Value<string>("text");
            IsReset = p.Value<bool?>("isReset") ?? false;
        }

        public string Delta { get; }
        /// <summary>The step's text so far; null when the turn set <c>FullText = false</c>.</summary>
        public string Text { get; }
        /// <summary>First delta of a step after a tool round: replace the text shown so far.</summary>
        public bool IsReset { get; }
    }

    public sealed class PartialJsonEvent : TurnEvent
    {
        internal PartialJsonEvent(string m, JObject p) : base(m, p)
        {
            Json = p.Value<string>("json");
            Delta = p.Value<string>("delta") ?? "";
        }

        /// <summary>The JSON text so far; null when the turn set <c>FullText = false</c>.</summary>
        public string Json { get; }
        public string Delta { get; }
    }

    public sealed class ToolCallRequestedEvent : TurnEvent
    {
        internal ToolCallRequestedEvent(string m, JObject p) : base(m, p)
        {
            CallId = p.Value<string>("callId");
            Name = p.Value<string>("name");
            Arguments = p["arguments"] as JObject ?? new JObject();
            TimeoutMs = p.Value<int?>("timeoutMs") ?? 0;
        }

        public string CallId { get; }
        public string Name { get; }
        /// <summary>Valid against the tool's schema.</summary>
        public JObject Arguments { get; }
        /// <summary>0 = none.</summary>
        public int TimeoutMs { get; }
    }

    public sealed class ToolCallCompletedEvent : TurnEvent
    {
        internal ToolCallCompletedEvent(string m, JObject p) : base(m, p)
        {
            CallId = p.Value<string>("callId");
            Name = p.Value<string>("name");
            Output = p["output"];
            Error = p.Value<string>("error");
        }

        public string CallId { get; }
        public string Name { get; }
        public JToken Output { get; }
        public string Error { get; }
    }

    public sealed class ToolCallWithdrawnEvent : TurnEvent
    {
        internal ToolCallWithdrawnEvent(string m, JObject p) : base(m, p)
        {
            CallId = p.Value<string>("callId");
            Name = p.Value<string>("name");
            Reason = p.Value<string>("reason");
        }

        public string CallId { get; }
        public string Name { get; }
        /// <summary><c>cancelled</c>, <c>timeout</c> or <c>turn_ended</c>.</summary>
        public string Reason { get; }
    }

    public sealed class ContextTrimmedEvent : TurnEvent
    {
        internal ContextTrimmedEvent(string m, JObject p) : base(m, p)
        {
            DroppedTurns = p.Value<int?>("droppedTurns") ?? 0;
            KeptTurns = p.Value<int?>("keptTurns") ?? 0;
            PromptTokens = p.Value<int?>("promptTokens") ?? 0;
            ContextSize = p.Value<int?>("contextSize") ?? 0;
        }

        public int DroppedTurns { get; }
        public int KeptTurns { get; }
        public int PromptTokens { get; }
        public int ContextSize { get; }
    }

    public sealed class TurnCompletedEvent : TurnEvent
    {
        internal TurnCompletedEvent(string m, JObject p) : base(m, p) { Result = new TurnResult(p); }
        public TurnResult Result { get; }
    }

    public sealed class TurnFailedEvent : TurnEvent
    {
        internal TurnFailedEvent(string m, JObject p) : base(m, p)
        {
            var e = p["error"] as JObject;
            Code = e?.Value<string>("code");
            Message = e?.Value<string>("message");
            Retryable = e?.Value<bool?>("retryable") ?? false;
        }

        public string Code { get; }
        public string Message { get; }
        public bool Retryable { get; }
        public OamBridgeException ToException() => OamBridgeException.FromTurnError(Params["error"] as JObject);
    }
}

namespace Oam.Bridge
{
    /// <summary>What a registered tool handler answered and how the bridge took it.</summary>
    public sealed class ToolCallSubmission
    {
        internal ToolCallSubmission(ToolCallRequestedEvent call, JToken output, string error, bool accepted,
            System.Exception submitError)
        {
            Call = call;
            Output = output;
            Error = error;
            Accepted = accepted;
            SubmitError = submitError;
        }

        public ToolCallRequestedEvent Call { get; }
        /// <summary>The handler's result, or null when it failed.</summary>
        public JToken Output { get; }
        /// <summary>The handler's error message, or null when it succeeded.</summary>
        public string Error { get; }
        /// <summary>The <c>npc/submit</c> result's <c>accepted</c>.</summary>
        public bool Accepted { get; }
        /// <summary>Why <c>npc/submit</c> failed (e.g. <c>unknown_tool_call</c> after a timeout), or null.</summary>
        public System.Exception SubmitError { get; }
    }
}
