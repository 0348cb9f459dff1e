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
            if (Script != null) o["script"] = Script.DeepClone();
            return o;
        }
    }

    /// <summary><c>auto</c>, <c>required</c>, <c>none</c> or a named tool.</summary>
    public sealed class ToolChoice
    {
        readonly JToken _json;
        ToolChoice(JToken json) { _json = json; }

        public static readonly ToolChoice Auto = new ToolChoice("auto");
        public static readonly ToolChoice Required = new ToolChoice("required");
        public static readonly ToolChoice None = new ToolChoice("none");
        public static ToolChoice Tool(string name) => new ToolChoice(new JObject { ["tool"] = name });

        internal JToken ToJson() => _json.DeepClone();
        public override string ToString() => _json.ToString(Newtonsoft.Json.Formatting.None);
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

        internal void WriteTo(JObject o)
        {
            if (ToolChoice != null) o["toolChoice"] = ToolChoice.ToJson();
            if (MaxToolRounds.HasValue) o["maxToolRounds"] = MaxToolRounds.Value;
            if (MaxToolCalls.HasValue) o["maxToolCalls"] = MaxToolCalls.Value;
            if (Schema != null) o["schema"] = Schema.DeepClone();
            if (ToolTimeoutMs.HasValue) o["toolTimeoutMs"] = ToolTimeoutMs.Value;
            if (FullText.HasValue) o["fullText"] = FullText.Value;
        }
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
        }

        public string Name { get; }
        public bool Available { get; }
        public string Reason { get; }
        public int ContextSize { get; }
        public IReadOnlyList<string> Features { get; }

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
        public string FinishReason { get; }
        public IReadOnlyList<string> Warnings { get; }
        /// <summary>The event's params as received.</summary>
        public JObject Raw { get; }
    }
}
