using System;
using System.Collections.Generic;
using System.Linq;
using Newtonsoft.Json.Linq;

namespace Oam.Bridge
{
    /// <summary>A tool the model may call; the game executes it (see <see cref="OamBridgeClient.RegisterTool(string, string, Func{JToken, System.Threading.Tasks.Task{JToken}})"/>).</summary>
    public sealed class ToolDefinition
    {
        public ToolDefinition(string name, string description = "", JObject parameters = null)
        {
            Name = name ?? throw new ArgumentNullException(nameof(name));
            Description = description ?? "";
            Parameters = parameters ?? new JObject { ["type"] = "object" };
        }

        public string Name { get; }
        public string Description { get; }
        /// <summary>A JSON Schema object for the arguments.</summary>
        public JObject Parameters { get; }

        internal JObject ToJson() => new JObject
        {
            ["name"] = Name, ["description"] = Description, ["parameters"] = Parameters.DeepClone(),
        };
    }

    public sealed class Persona
    {
        public Persona(string name) { Name = name ?? throw new ArgumentNullException(nameof(name)); }
        public string Name { get; }
        public string Role { get; set; } = "";
        public IList<string> Traits { get; set; } = new List<string>();
        public string SpeechStyle { get; set; } = "";

        internal JObject ToJson() => new JObject
        {
            ["name"] = Name, ["role"] = Role ?? "", ["traits"] = new JArray((Traits ?? new List<string>()).ToArray()),
            ["speechStyle"] = SpeechStyle ?? "",
        };
    }

    /// <summary>Sampling options; null fields are left to the engine.</summary>
    public sealed class GenerationOptions
    {
        public double? Temperature { get; set; }
        public int? MaxTokens { get; set; }
        public long? Seed { get; set; }
        public double? TopP { get; set; }

        internal JObject ToJson()
        {
            var o = new JObject();
            if (Temperature.HasValue) o["temperature"] = Temperature.Value;
            if (MaxTokens.HasValue) o["maxTokens"] = MaxTokens.Value;
            if (Seed.HasValue) o["seed"] = Seed.Value;
            if (TopP.HasValue) o["topP"] = TopP.Value;
            return o;
        }
    }

    /// <summary>
    /// <c>npc/create</c>'s <c>fallbacks</c>: what the NPC says when the model's guardrails block a
    /// turn (<see cref="GuardrailViolation"/>) or it refuses (<see cref="Refusal"/>), for turns whose
    /// <see cref="RespondOptions.Guardrail"/> is <see cref="GuardrailPolicy.Fallback"/> or
    /// <see cref="GuardrailPolicy.Retry"/>. At most 32 non-empty lines each, used in turn.
    /// </summary>
    public sealed class NpcFallbacks
    {
        public IList<string> GuardrailViolation { get; set; } = new List<string>();
        public IList<string> Refusal { get; set; } = new List<string>();

        internal JObject ToJson() => new JObject
        {
            ["guardrailViolation"] = new JArray((GuardrailViolation ?? new List<string>()).ToArray()),
            ["refusal"] = new JArray((Refusal ?? new List<string>()).ToArray()),
        };
    }

    /// <summary>What <c>npc/create</c> takes.</summary>
    public sealed class NpcConfig
    {
        public NpcConfig(string npcId) { NpcId = npcId ?? throw new ArgumentNullException(nameof(npcId)); }

        public string NpcId { get; }
        public string Instructions { get; set; }
        public Persona Persona { get; set; }
        public IList<ToolDefinition> Tools { get; set; } = new List<ToolDefinition>();
        /// <summary><c>auto</c> (default), <c>scripted</c>, <c>llama</c> or <c>native</c>.</summary>
        public string Engine { get; set; }
        public GenerationOptions Options { get; set; }
        /// <summary>
        /// Tags the NPC carries (where it is, its faction): world facts scoped by tag reach the NPCs
        /// that carry the tag. Change them later with <see cref="OamBridgeClient.SetTagsAsync"/>.
        /// </summary>
        public IList<string> Tags { get; set; } = new List<string>();
        /// <summary>Lines said instead when a turn's <see cref="RespondOptions.Guardrail"/> is <c>Fallback</c> or <c>Retry</c>.</summary>
        public NpcFallbacks Fallbacks { get; set; }
        /// <summary>Scripted engine only: the steps this NPC plays (see protocol.md).</summary>
        public JArray Script { get; set; }

        internal JObject ToJson()
        {
            var o = new JObject { ["npcId"] = NpcId };
            if (Instructions != null) o["instructions"] = Instructions;
            if (Persona != null) o["persona"] = Persona.ToJson();
            if (Tools != null && Tools.Count > 0) o["tools"] = new JArray(Tools.Select(t => (object)t.ToJson()).ToArray());
            if (Engine != null) o["engine"] = Engine;
            if (Options != null) o["options"] = Options.ToJson();
            if (Tags != null && Tags.Count > 0) o["tags"] = new JArray(Tags.ToArray());
            if (Fallbacks != null) o["fallbacks"] = Fallbacks.ToJson();
            if (Script != null) o["script"] = Script.DeepClone();
            return o;
        }
    }

    /// <summary><c>auto</c>, <c>required</c>, <c>none</c>, <c>tool_or_answer</c> or a named tool.</summary>
    public sealed class ToolChoice
    {
        readonly JToken _json;
        ToolChoice(JToken json) { _json = json; }

        public static readonly ToolChoice Auto = new ToolChoice("auto");
        public static readonly ToolChoice Required = new ToolChoice("required");
        public static readonly ToolChoice None = new ToolChoice("none");
        /// <summary>The model first decides between calling one of the NPC's tools and answering in words.</summary>
        public static readonly ToolChoice ToolOrAnswer = new ToolChoice("tool_or_answer");
        public static ToolChoice Tool(string name) => new ToolChoice(new JObject { ["tool"] = name });

        internal JToken ToJson() => _json.DeepClone();
        public override string ToString() => _json.ToString(Newtonsoft.Json.Formatting.None);
    }

    /// <summary>What a turn does when the model's guardrails block it or the model refuses (<c>npc/respond</c> <c>guardrail</c>).</summary>
    public enum GuardrailPolicy
    {
        /// <summary>The turn fails with <c>guardrail_violation</c> or <c>refusal</c> (the bridge's default).</summary>
        Fail,
        /// <summary>The turn completes with the NPC's next fallback line, <see cref="TurnResult.FinishReason"/> <c>fallback</c>.</summary>
        Fallback,
        /// <summary>The failed step runs once more as plain text (<c>retried_as_text</c>); if that fails too, the fallback line.</summary>
        Retry,
    }

    /// <summary>The optional parameters of <c>npc/respond</c>; null fields take the bridge's defaults.</summary>
    public sealed class RespondOptions
    {
        public ToolChoice ToolChoice { get; set; }
        public int? MaxToolRounds { get; set; }
        public int? MaxToolCalls { get; set; }
        /// <summary>A JSON Schema: the answer is JSON (<see cref="TurnResult.Json"/>).</summary>
        public JObject Schema { get; set; }
        /// <summary>Per tool call; 0 = no timeout. Bridge default 60000.</summary>
        public int? ToolTimeoutMs { get; set; }
        /// <summary>False: deltas only (<see cref="TextDeltaEvent.Text"/> is null).</summary>
        public bool? FullText { get; set; }
        /// <summary>
        /// Who says the prompt; null: the player. Another NPC's id stands for that NPC (its persona
        /// name, or its id without a persona); any other string is the speaker's name as it is.
        /// </summary>
        public string Speaker { get; set; }
        /// <summary>Null: the bridge's default, <see cref="GuardrailPolicy.Fail"/>.</summary>
        public GuardrailPolicy? Guardrail { get; set; }

        internal void WriteTo(JObject o)
        {
            if (ToolChoice != null) o["toolChoice"] = ToolChoice.ToJson();
            if (MaxToolRounds.HasValue) o["maxToolRounds"] = MaxToolRounds.Value;
            if (MaxToolCalls.HasValue) o["maxToolCalls"] = MaxToolCalls.Value;
            if (Schema != null) o["schema"] = Schema.DeepClone();
            if (ToolTimeoutMs.HasValue) o["toolTimeoutMs"] = ToolTimeoutMs.Value;
            if (FullText.HasValue) o["fullText"] = FullText.Value;
            if (Speaker != null) o["speaker"] = Speaker;
            if (Guardrail.HasValue) o["guardrail"] = GuardrailName(Guardrail.Value);
        }

        internal static string GuardrailName(GuardrailPolicy policy)
        {
            switch (policy)
            {
                case GuardrailPolicy.Fallback: return "fallback";
                case GuardrailPolicy.Retry: return "retry";
                default: return "fail";
            }
        }
    }

    /// <summary>One choice of <c>npc/decide</c>.</summary>
    public sealed class DecisionOption
    {
        public DecisionOption(string name, string description = "", JObject parameters = null)
        {
            Name = name ?? throw new ArgumentNullException(nameof(name));
            Description = description ?? "";
            Parameters = parameters;
        }

        /// <summary>Unique, non-empty: what <see cref="Decision.Choice"/> names.</summary>
        public string Name { get; }
        public string Description { get; }
        /// <summary>Optional: an object JSON Schema for the option's arguments (<see cref="Decision.Arguments"/>).</summary>
        public JObject Parameters { get; }

        internal JObject ToJson()
        {
            var o = new JObject { ["name"] = Name, ["description"] = Description };
            if (Parameters != null) o["parameters"] = Parameters.DeepClone();
            return o;
        }
    }

    /// <summary>The optional parameters of <c>npc/decide</c>; null fields take the bridge's defaults.</summary>
    public sealed class DecideOptions
    {
        /// <summary>Default true: the model writes a short reason before it chooses.</summary>
        public bool? Reasoning { get; set; }
        /// <summary>Default false: true stores the situation and the answer in the dialogue history.</summary>
        public bool? Remember { get; set; }

        internal void WriteTo(JObject o)
        {
            if (Reasoning.HasValue) o["reasoning"] = Reasoning.Value;
            if (Remember.HasValue) o["remember"] = Remember.Value;
        }
    }

    /// <summary>The answer of a decision turn (<c>npc/decide</c>): its <see cref="TurnResult.Json"/>, typed.</summary>
    public sealed class Decision
    {
        public Decision(TurnResult result)
        {
            Result = result ?? throw new ArgumentNullException(nameof(result));
            var o = result.Json as JObject ?? new JObject();
            Choice = o.Value<string>("choice");
            Reasoning = o.Value<string>("reasoning");
            Arguments = o["arguments"] as JObject;
        }

        /// <summary>The name of the option chosen (always one of the listed options).</summary>
        public string Choice { get; }
        /// <summary>The model's reason; null when the decision was made with <c>Reasoning = false</c>.</summary>
        public string Reasoning { get; }
        /// <summary>The chosen option's arguments; null for an option without <c>parameters</c>.</summary>
        public JObject Arguments { get; }
        /// <summary>The whole <c>turn/completed</c> (world revision, usage, ...).</summary>
        public TurnResult Result { get; }
    }

    /// <summary>
    /// A world fact (<c>world/set</c>, <c>world/get</c>). Scope: with <see cref="NpcIds"/> and
    /// <see cref="Tags"/> both null every NPC sees it; otherwise the NPCs listed or carrying one of
    /// the tags. <see cref="Lore"/>: not shown in every prompt; NPCs recall it with the bridge's
    /// <c>recall</c> tool.
    /// </summary>
    public sealed class WorldFact
    {
        public WorldFact(string key, JToken value)
        {
            Key = key ?? throw new ArgumentNullException(nameof(key));
            Value = value ?? throw new ArgumentNullException(nameof(value), "delete a fact with DeleteWorldFactAsync");
        }

        internal WorldFact(JObject o)
        {
            Key = o.Value<string>("key");
            Value = o["value"];
            NpcIds = (o["npcIds"] as JArray)?.Select(t => (string)t).ToList();
            Tags = (o["tags"] as JArray)?.Select(t => (string)t).ToList();
            Lore = o.Value<bool?>("lore") ?? false;
        }

        public string Key { get; }
        /// <summary>Any JSON but null: a string is shown as it is, anything else as compact JSON.</summary>
        public JToken Value { get; }
        public IList<string> NpcIds { get; set; }
        public IList<string> Tags { get; set; }
        public bool Lore { get; set; }

        internal JObject ToJson()
        {
            var o = new JObject { ["key"] = Key, ["value"] = Value.DeepClone() };
            if (NpcIds != null) o["npcIds"] = new JArray(NpcIds.ToArray());
            if (Tags != null) o["tags"] = new JArray(Tags.ToArray());
            if (Lore) o["lore"] = true;
            return o;
        }
    }

    /// <summary>The result of <c>world/get</c>: keep it in the save data and set the facts again after loading.</summary>
    public sealed class WorldState
    {
        internal WorldState(JObject o)
        {
            Raw = o;
            Revision = o.Value<int?>("revision") ?? 0;
            Facts = (o["facts"] as JArray)?.OfType<JObject>().Select(f => new WorldFact(f)).ToList() ?? new List<WorldFact>();
        }

        /// <summary>Starts at 0; every change adds 1.</summary>
        public int Revision { get; }
        /// <summary>Sorted by key.</summary>
        public IReadOnlyList<WorldFact> Facts { get; }
        public JObject Raw { get; }
    }

    /// <summary>The result of <c>world/delete</c>.</summary>
    public sealed class WorldDeleteResult
    {
        internal WorldDeleteResult(JObject o)
        {
            Revision = o.Value<int?>("revision") ?? 0;
            Deleted = o.Value<bool?>("deleted") ?? false;
        }

        public int Revision { get; }
        /// <summary>False when there was no such fact (the revision then stays as it was).</summary>
        public bool Deleted { get; }
    }

    public sealed class EngineInfo
    {
        internal EngineInfo(JObject o)
        {
            Name = o.Value<string>("name");
            Available = o.Value<bool?>("available") ?? false;
            Reason = o.Value<string>("reason");
            ContextSize = o.Value<int?>("contextSize") ?? 0;
            Features = (o["features"] as JArray)?.Select(f => (string)f).ToList() ?? new List<string>();
            CpuVariant = o.Value<string>("cpuVariant");
            ChatTemplate = o.Value<string>("chatTemplate");
        }

        public string Name { get; }
        public bool Available { get; }
        public string Reason { get; }
        public int ContextSize { get; }
        public IReadOnlyList<string> Features { get; }
        /// <summary>llama: the build of llama.cpp's CPU backend in use ("haswell", "zen4", ...), once
        /// its model has loaded; null before and for the other engines.</summary>
        public string CpuVariant { get; }
        /// <summary>llama: where the prompt's form comes from, once its model has loaded: "gguf" (the
        /// model file's own chat template) or "chatml-fallback" (the file has none); null before and
        /// for the other engines.</summary>
        public string ChatTemplate { get; }

        internal static List<EngineInfo> ListOf(JToken t) =>
            (t as JArray)?.OfType<JObject>().Select(e => new EngineInfo(e)).ToList() ?? new List<EngineInfo>();
    }

    public sealed class InitializeResult
    {
        internal InitializeResult(JObject o)
        {
            Raw = o;
            ProtocolVersion = o.Value<int?>("protocolVersion") ?? 0;
            ServerName = (string)o.SelectToken("serverInfo.name");
            ServerVersion = (string)o.SelectToken("serverInfo.version");
            Capabilities = o["capabilities"] as JObject ?? new JObject();
            Engines = EngineInfo.ListOf(o["engines"]);
            DefaultEngine = o.Value<string>("defaultEngine");
            Limits = o["limits"] as JObject ?? new JObject();
        }

        public int ProtocolVersion { get; }
        public string ServerName { get; }
        public string ServerVersion { get; }
        /// <summary>An omitted capability is unsupported.</summary>
        public JObject Capabilities { get; }
        public IReadOnlyList<EngineInfo> Engines { get; }
        public string DefaultEngine { get; }
        public JObject Limits { get; }
        public JObject Raw { get; }
    }

    public sealed class EngineStatus
    {
        internal EngineStatus(JObject o)
        {
            Raw = o;
            Engines = EngineInfo.ListOf(o["engines"]);
            DefaultEngine = o.Value<string>("defaultEngine");
        }

        public IReadOnlyList<EngineInfo> Engines { get; }
        public string DefaultEngine { get; }
        public JObject Raw { get; }
    }

    /// <summary>The result of <c>npc/create</c>.</summary>
    public sealed class NpcInfo
    {
        internal NpcInfo(JObject o)
        {
            NpcId = o.Value<string>("npcId");
            Engine = o.Value<string>("engine");
            ContextSize = o.Value<int?>("contextSize") ?? 0;
        }

        public string NpcId { get; }
        /// <summary>The engine chosen.</summary>
        public string Engine { get; }
        public int ContextSize { get; }
    }

    /// <summary>One entry of <c>npc/list</c>.</summary>
    public sealed class NpcSummary
    {
        internal NpcSummary(JObject o)
        {
            NpcId = o.Value<string>("npcId");
            Engine = o.Value<string>("engine");
            Turns = o.Value<int?>("turns") ?? 0;
            Busy = o.Value<bool?>("busy") ?? false;
            Queued = o.Value<int?>("queued") ?? 0;
        }

        public string NpcId { get; }
        public string Engine { get; }
        public int Turns { get; }
        public bool Busy { get; }
        public int Queued { get; }
    }

    public sealed class RestoreResult
    {
        internal RestoreResult(JObject o)
        {
            NpcId = o.Value<string>("npcId");
            Turns = o.Value<int?>("turns") ?? 0;
        }

        public string NpcId { get; }
        public int Turns { get; }
    }

    public sealed class TokenCount
    {
        internal TokenCount(JObject o)
        {
            Tokens = o.Value<int?>("tokens") ?? 0;
            PromptTokens = o.Value<int?>("promptTokens");
            ContextSize = o.Value<int?>("contextSize") ?? 0;
        }

        public int Tokens { get; }
        /// <summary>The NPC's current prompt; null without an npcId.</summary>
        public int? PromptTokens { get; }
        public int ContextSize { get; }
    }

    public sealed class Usage
    {
        internal Usage(JObject o)
        {
            InputTokens = o?.Value<int?>("inputTokens") ?? 0;
            OutputTokens = o?.Value<int?>("outputTokens") ?? 0;
            CachedTokens = o?.Value<int?>("cachedTokens") ?? 0;
        }

        public int InputTokens { get; }
        public int OutputTokens { get; }
        public int CachedTokens { get; }
    }

    /// <summary>A tool call of a completed turn: <see cref="Output"/> or <see cref="Error"/>.</summary>
    public sealed class ToolCallRecord
    {
        internal ToolCallRecord(JObject o)
        {
            CallId = o.Value<string>("callId");
            Name = o.Value<string>("name");
            Arguments = o["arguments"] as JObject ?? new JObject();
            Output = o["output"];
            Error = o.Value<string>("error");
        }

        public string CallId { get; }
        public string Name { get; }
        public JObject Arguments { get; }
        public JToken Output { get; }
        public string Error { get; }
    }

    /// <summary>The payload of <c>turn/completed</c>.</summary>
    public sealed class TurnResult
    {
        internal TurnResult(JObject p)
        {
            Raw = p;
            NpcId = p.Value<string>("npcId");
            TurnId = p.Value<string>("turnId");
            Text = p.Value<string>("text") ?? "";
            Json = p["json"] == null || p["json"].Type == JTokenType.Null ? null : p["json"];
            ToolCalls = (p["toolCalls"] as JArray)?.OfType<JObject>().Select(t => new ToolCallRecord(t)).ToList()
                        ?? new List<ToolCallRecord>();
            Usage = new Usage(p["usage"] as JObject);
            Steps = p.Value<int?>("steps") ?? 0;
            FinishReason = p.Value<string>("finishReason");
            Warnings = (p["warnings"] as JArray)?.Select(w => (string)w).ToList() ?? new List<string>();
            WorldRevision = p.Value<int?>("worldRevision") ?? 0;
        }

        public string NpcId { get; }
        public string TurnId { get; }
        /// <summary>The final answer.</summary>
        public string Text { get; }
        /// <summary>Schema turns: the parsed answer; otherwise null.</summary>
        public JToken Json { get; }
        public IReadOnlyList<ToolCallRecord> ToolCalls { get; }
        public Usage Usage { get; }
        public int Steps { get; }
        /// <summary>
        /// <c>stop</c>, <c>length</c>, <c>fallback</c> (a guardrail fallback line), <c>retried_as_text</c>,
        /// <c>prewarmed</c>, ... (<see cref="FinishReasons"/>).
        /// </summary>
        public string FinishReason { get; }
        /// <summary>What the bridge or engine could not honour exactly; after a guardrail fallback or retry, the original error first.</summary>
        public IReadOnlyList<string> Warnings { get; }
        /// <summary>The world revision the turn's last model step saw.</summary>
        public int WorldRevision { get; }
        /// <summary>The event's params as received.</summary>
        public JObject Raw { get; }
    }

    /// <summary>The values of <see cref="TurnResult.FinishReason"/> the game layer adds, and the usual ones.</summary>
    public static class FinishReasons
    {
        public const string Stop = "stop";
        public const string Length = "length";
        public const string Fallback = "fallback";
        public const string RetriedAsText = "retried_as_text";
        public const string Prewarmed = "prewarmed";
    }

    /// <summary>The method that started a turn (<see cref="TurnStartedEvent.Kind"/>, <see cref="Turn.Kind"/>).</summary>
    public static class TurnKinds
    {
        public const string Respond = "respond";
        public const string Decide = "decide";
        public const string Prewarm = "prewarm";
    }
}
