using System;
using System.Collections.Generic;
using Newtonsoft.Json.Linq;

namespace Oam.Bridge
{
    /// <summary>
    /// An error from the bridge (a JSON-RPC error response or a <c>turn/failed</c> event) or from
    /// the transport (the bridge exited or its pipes broke: <see cref="Code"/> is
    /// <see cref="ErrorCodes.Transport"/>).
    /// </summary>
    public class OamBridgeException : Exception
    {
        public OamBridgeException(string code, int rpcCode, string message, bool retryable = false,
            JObject data = null, Exception inner = null)
            : base(message, inner)
        {
            Code = code;
            RpcCode = rpcCode;
            Retryable = retryable;
            Data = data;
        }

        /// <summary>The stable string code (<c>data.code</c>), e.g. <c>unknown_npc</c>, <c>cancelled</c>.</summary>
        public string Code { get; }

        /// <summary>The JSON-RPC integer code, e.g. -31020.</summary>
        public int RpcCode { get; }

        /// <summary>Whether retrying later may succeed (<c>busy</c>, <c>overloaded</c>, <c>rate_limited</c>, ...).</summary>
        public bool Retryable { get; }

        /// <summary>The error's <c>data</c> object (details such as <c>reason</c>, <c>npcId</c>, <c>callId</c>), or null.</summary>
        public new JObject Data { get; }

        public override string ToString() => $"OamBridgeException [{Code} {RpcCode}]: {Message}";

        internal static OamBridgeException FromRpcError(JObject error)
        {
            var data = error["data"] as JObject;
            int rpc = error.Value<int?>("code") ?? ErrorCodes.InternalErrorRpc;
            string code = data?.Value<string>("code") ?? ErrorCodes.NameOf(rpc) ?? "internal_error";
            bool retryable = data?.Value<bool?>("retryable") ?? false;
            return new OamBridgeException(code, rpc, error.Value<string>("message") ?? code, retryable, data);
        }

        internal static OamBridgeException FromTurnError(JObject error)
        {
            string code = error?.Value<string>("code") ?? "internal_error";
            return new OamBridgeException(code, ErrorCodes.RpcCodeOf(code),
                error?.Value<string>("message") ?? code, error?.Value<bool?>("retryable") ?? false, error);
        }

        internal static OamBridgeException TransportError(string message, Exception inner = null) =>
            new OamBridgeException(ErrorCodes.Transport, ErrorCodes.InternalErrorRpc, message, false, null, inner);
    }

    /// <summary>The string codes of protocol.md's error table and their JSON-RPC codes.</summary>
    public static class ErrorCodes
    {
        public const string ModelUnavailable = "model_unavailable";
        public const string GuardrailViolation = "guardrail_violation";
        public const string Refusal = "refusal";
        public const string ContextSizeExceeded = "context_size_exceeded";
        public const string RateLimited = "rate_limited";
        public const string UnsupportedLanguage = "unsupported_language";
        public const string InvalidSchema = "invalid_schema";
        public const string ToolFailed = "tool_failed";
        public const string Cancelled = "cancelled";
        public const string Busy = "busy";
        public const string InvalidRequest = "invalid_request";
        public const string GenerationFailed = "generation_failed";
        public const string UnknownNpc = "unknown_npc";
        public const string UnknownToolCall = "unknown_tool_call";
        public const string NotInitialized = "not_initialized";
        public const string Overloaded = "overloaded";
        public const string MessageTooLarge = "message_too_large";
        public const string NpcExists = "npc_exists";
        public const string ShuttingDown = "shutting_down";
        public const string LimitReached = "limit_reached";
        public const string ParseError = "parse_error";
        public const string InvalidMessage = "invalid_message";
        public const string MethodNotFound = "method_not_found";
        public const string InvalidParams = "invalid_params";
        public const string InternalError = "internal_error";

        /// <summary>Client-side only: the bridge process exited or its pipes broke.</summary>
        public const string Transport = "transport";

        internal const int InternalErrorRpc = -32603;

        static readonly Dictionary<string, int> Rpc = new Dictionary<string, int>
        {
            [ModelUnavailable] = -31001, [GuardrailViolation] = -31002, [Refusal] = -31003,
            [ContextSizeExceeded] = -31004, [RateLimited] = -31005, [UnsupportedLanguage] = -31006,
            [InvalidSchema] = -31007, [ToolFailed] = -31008, [Cancelled] = -31009, [Busy] = -31010,
            [InvalidRequest] = -31011, [GenerationFailed] = -31012, [UnknownNpc] = -31020,
            [UnknownToolCall] = -31021, [NotInitialized] = -31022, [Overloaded] = -31023,
            [MessageTooLarge] = -31024, [NpcExists] = -31025, [ShuttingDown] = -31026,
            [LimitReached] = -31027, [ParseError] = -32700, [InvalidMessage] = -32600,
            [MethodNotFound] = -32601, [InvalidParams] = -32602, [InternalError] = -32603,
        };

        /// <summary>The JSON-RPC code of a string code (-32603 for an unknown one).</summary>
        public static int RpcCodeOf(string code) =>
            code != null && Rpc.TryGetValue(code, out int rpc) ? rpc : InternalErrorRpc;

        /// <summary>The string code of a JSON-RPC code, or null.</summary>
        public static string NameOf(int rpcCode)
        {
            foreach (var kv in Rpc)
                if (kv.Value == rpcCode) return kv.Key;
            return null;
        }
    }
}
