extends RefCounted
## Pure protocol logic for oam-bridge (protocol.md, version 1): JSON-RPC 2.0, one message
## per line. No I/O, no nodes, no signals, no state: every function maps values to values,
## so this file can be reviewed against protocol.md on its own. No class_name (a project
## without the editor's class cache still loads it): preload it,
##   const OamProtocol := preload("res://addons/oam_bridge/oam_protocol.gd")
## tests/replay_test.py ports each function here line for line and replays the shared
## scenario against the real bridge with the lines these functions build.

const PROTOCOL_VERSION := 1

## Client-side error code: the bridge is not running, or exited before it answered.
const BRIDGE_CLOSED := "bridge_closed"

## Key of the marker Dictionary a tool handler returns to report an error (see tool_error).
const TOOL_ERROR_KEY := "__oam_tool_error__"

## string code -> [JSON-RPC code, retryable]. Mirrors bridge/errors.py and protocol.md.
const ERROR_CODES := {
	"model_unavailable": [-31001, false],
	"guardrail_violation": [-31002, false],
	"refusal": [-31003, false],
	"context_size_exceeded": [-31004, false],
	"rate_limited": [-31005, true],
	"unsupported_language": [-31006, false],
	"invalid_schema": [-31007, false],
	"tool_failed": [-31008, false],
	"cancelled": [-31009, false],
	"busy": [-31010, true],
	"invalid_request": [-31011, false],
	"generation_failed": [-31012, true],
	"unknown_npc": [-31020, false],
	"unknown_tool_call": [-31021, false],
	"not_initialized": [-31022, false],
	"overloaded": [-31023, true],
	"message_too_large": [-31024, false],
	"npc_exists": [-31025, false],
	"shutting_down": [-31026, false],
	"limit_reached": [-31027, false],
	"parse_error": [-32700, false],
	"invalid_message": [-32600, false],
	"method_not_found": [-32601, false],
	"invalid_params": [-32602, false],
	"internal_error": [-32603, false],
}

## Every event method -> the OamBridgeClient signal it is emitted as.
const EVENT_SIGNALS := {
	"turn/started": "turn_started",
	"turn/textDelta": "text_delta",
	"turn/partialJson": "partial_json",
	"turn/toolCallRequested": "tool_call_requested",
	"turn/toolCallCompleted": "tool_call_completed",
	"turn/toolCallWithdrawn": "tool_call_withdrawn",
	"turn/contextTrimmed": "context_trimmed",
	"turn/completed": "turn_completed",
	"turn/failed": "turn_failed",
}

const TERMINAL_EVENTS := ["turn/completed", "turn/failed"]

## turn/started "kind": the method that started the turn.
const KIND_RESPOND := "respond"
const KIND_DECIDE := "decide"
const KIND_PREWARM := "prewarm"

## npc/respond "guardrail": what a guardrail_violation or refusal does to the turn.
const GUARDRAIL_FAIL := "fail"  # turn_failed with the code (the default)
const GUARDRAIL_FALLBACK := "fallback"  # completes with the NPC's next fallback line
const GUARDRAIL_RETRY := "retry"  # one more try as plain text, then the fallback line

## npc/respond "toolChoice": a tool, or answer directly (the bridge adds respond_directly).
const TOOL_CHOICE_TOOL_OR_ANSWER := "tool_or_answer"

## Event fields protocol.md defines as integers (Godot parses every JSON number as a float;
## typed_event gives these back as ints). "usage" holds integer token counts.
const EVENT_INT_FIELDS := [
	"seq",
	"worldRevision",
	"steps",
	"droppedTurns",
	"keptTurns",
	"promptTokens",
	"contextSize",
	"timeoutMs"
]
const USAGE_INT_FIELDS := ["inputTokens", "outputTokens", "cachedTokens"]

## Result fields protocol.md defines as integers, per method (typed_result).
const RESULT_INT_FIELDS := {
	"initialize": ["protocolVersion"],
	"npc/restore": ["turns"],
	"tokens/count": ["tokens", "promptTokens", "contextSize"],
	"world/set": ["revision"],
	"world/delete": ["revision"],
	"world/get": ["revision"],
}

# --- outgoing lines ---------------------------------------------------------------------


## A request line (no trailing newline). An empty params Dictionary is sent as {}.
static func build_request(id: int, method: String, params: Dictionary = {}) -> String:
	return encode({"jsonrpc": "2.0", "id": id, "method": method, "params": params})


## A notification line (no id, so the bridge never answers it), e.g. "exit".
static func build_notification(method: String, params: Dictionary = {}) -> String:
	return encode({"jsonrpc": "2.0", "method": method, "params": params})


## Compact JSON, keys in insertion order (a schema's property order matters to the bridge).
static func encode(message: Dictionary) -> String:
	return JSON.stringify(normalize_numbers(message), "", false)


## Godot's JSON parser turns every number into a float. The bridge accepts a whole float
## where it wants an integer (a save's "version", "maxToolRounds", ...), but the lines we
## send stay exact: whole floats become ints, so a save goes back to npc/restore as it came.
static func normalize_numbers(value: Variant) -> Variant:
	var kind := typeof(value)
	if kind == TYPE_FLOAT:
		var number: float = value
		if is_finite(number) and number == floorf(number) and absf(number) < 9.0e15:
			return int(number)
		return number
	if kind == TYPE_DICTIONARY:
		var source: Dictionary = value
		var out := {}
		for key: Variant in source:
			out[str(key)] = normalize_numbers(source[key])
		return out
	if kind == TYPE_ARRAY or (kind >= TYPE_PACKED_BYTE_ARRAY and kind <= TYPE_PACKED_STRING_ARRAY):
		var items := []
		for item: Variant in value:
			items.append(normalize_numbers(item))
		return items
	return value


# --- params of each method (field names exactly as in protocol.md) -----------------------


static func initialize_params(client_name: String, client_version: String) -> Dictionary:
	return {
		"protocolVersion": PROTOCOL_VERSION,
		"clientInfo": {"name": client_name, "version": client_version},
	}


## config: any of instructions, persona, tools, engine, model, options, tags, fallbacks,
## script (protocol names; see tool_spec and fallbacks).
static func create_params(npc_id: String, config: Dictionary) -> Dictionary:
	var params := config.duplicate(true)
	params["npcId"] = npc_id
	return params


## options: any of toolChoice, maxToolRounds, maxToolCalls, schema, toolTimeoutMs, fullText,
## speaker (another NPC's id, or a name; absent: the player), guardrail (GUARDRAIL_*).
static func respond_params(npc_id: String, prompt: String, options: Dictionary) -> Dictionary:
	var params := options.duplicate(true)
	params["npcId"] = npc_id
	params["prompt"] = prompt
	return params


static func submit_output_params(npc_id: String, call_id: String, output: Variant) -> Dictionary:
	return {"npcId": npc_id, "callId": call_id, "output": output}


static func submit_error_params(npc_id: String, call_id: String, message: String) -> Dictionary:
	return {"npcId": npc_id, "callId": call_id, "error": message}


## For npc/cancel, npc/transcript, npc/reset, npc/delete.
static func npc_params(npc_id: String) -> Dictionary:
	return {"npcId": npc_id}


## speaker (who speaks to the NPC next: another NPC's id, or a name) and prompt_prefix (how
## that line starts) are optional ("" leaves them out: the player, no prefix).
static func prewarm_params(npc_id: String, speaker: String, prompt_prefix: String) -> Dictionary:
	var params := {"npcId": npc_id}
	if not speaker.is_empty():
		params["speaker"] = speaker
	if not prompt_prefix.is_empty():
		params["promptPrefix"] = prompt_prefix
	return params


## npc_id "" restores under the id the save carries.
static func restore_params(save: Dictionary, npc_id: String) -> Dictionary:
	var params := {"save": save}
	if not npc_id.is_empty():
		params["npcId"] = npc_id
	return params


## npc_id and engine are optional ("" leaves them out).
static func count_tokens_params(text: String, npc_id: String, engine: String) -> Dictionary:
	var params := {"text": text}
	if not npc_id.is_empty():
		params["npcId"] = npc_id
	if not engine.is_empty():
		params["engine"] = engine
	return params


## A tool definition for npc/create's "tools" (parameters: a JSON Schema object).
static func tool_spec(name: String, description: String, parameters: Dictionary) -> Dictionary:
	return {"name": name, "description": description, "parameters": parameters}


## The tool's parameters as an object schema: a full schema ({"type": "object", ...}) is
## kept; a Dictionary of properties ({"item": {"type": "string"}}) becomes an object
## schema requiring all of them; {} takes no arguments.
static func object_schema(parameters: Dictionary) -> Dictionary:
	if parameters.has("type"):
		return parameters
	return {"type": "object", "properties": parameters, "required": parameters.keys()}


## A tool definition from its handler: the name is the handler's method name unless given
## (a lambda needs one).
static func tool_from_callable(
	handler: Callable, description: String, parameters: Dictionary = {}, name: String = ""
) -> Dictionary:
	var tool_name := name if not name.is_empty() else str(handler.get_method())
	return tool_spec(tool_name, description, object_schema(parameters))


## npc/create's "fallbacks": the lines said, in turn, when a turn whose guardrail policy is
## GUARDRAIL_FALLBACK or GUARDRAIL_RETRY is blocked (guardrail_violation) or refused.
## An empty list is left out.
static func fallbacks(
	guardrail_violation: PackedStringArray, refusal: PackedStringArray = PackedStringArray()
) -> Dictionary:
	var out := {}
	if not guardrail_violation.is_empty():
		out["guardrailViolation"] = Array(guardrail_violation)
	if not refusal.is_empty():
		out["refusal"] = Array(refusal)
	return out


## One option of npc/decide. parameters: an object JSON Schema for the option's arguments
## ({} leaves it out: the option takes none).
static func decision_option(
	name: String, description: String, parameters: Dictionary = {}
) -> Dictionary:
	var option := {"name": name, "description": description}
	if not parameters.is_empty():
		option["parameters"] = parameters
	return option


## options: Dictionaries from decision_option (1 to 64, names unique).
static func decide_params(
	npc_id: String, situation: String, options: Array, reasoning: bool, remember: bool
) -> Dictionary:
	return {
		"npcId": npc_id,
		"situation": situation,
		"options": options.duplicate(true),
		"reasoning": reasoning,
		"remember": remember,
	}


static func set_tags_params(npc_id: String, tags: PackedStringArray) -> Dictionary:
	return {"npcId": npc_id, "tags": Array(tags)}


## value: any JSON but null. Scope: tags and npc_ids (both empty: every NPC sees the fact;
## an empty one is left out). lore: kept out of prompts, told by the bridge's recall tool.
static func world_set_params(
	key: String, value: Variant, tags: PackedStringArray, npc_ids: PackedStringArray, lore: bool
) -> Dictionary:
	var params := {"key": key, "value": value}
	if not npc_ids.is_empty():
		params["npcIds"] = Array(npc_ids)
	if not tags.is_empty():
		params["tags"] = Array(tags)
	if lore:
		params["lore"] = true
	return params


## For world/delete.
static func world_key_params(key: String) -> Dictionary:
	return {"key": key}


## npc_id "" gets every fact; else only the facts that NPC can see.
static func world_get_params(npc_id: String) -> Dictionary:
	return {} if npc_id.is_empty() else {"npcId": npc_id}


# --- integers -------------------------------------------------------------------------


## A whole float as an int (3.0 -> 3); anything else as it is.
static func as_int_if_whole(value: Variant) -> Variant:
	if typeof(value) == TYPE_FLOAT:
		var number: float = value
		if is_finite(number) and number == floorf(number) and absf(number) < 9.0e15:
			return int(number)
	return value


## The event's params with the integer fields of protocol.md as ints (in place; returned).
static func typed_event(method: String, params: Dictionary) -> Dictionary:
	for field: String in EVENT_INT_FIELDS:
		if params.has(field):
			params[field] = as_int_if_whole(params[field])
	if typeof(params.get("usage")) == TYPE_DICTIONARY:
		var usage: Dictionary = params["usage"]
		for field: String in USAGE_INT_FIELDS:
			if usage.has(field):
				usage[field] = as_int_if_whole(usage[field])
	if method == "turn/completed" and typeof(params.get("toolCalls")) == TYPE_ARRAY:
		for record: Variant in params["toolCalls"]:
			if typeof(record) == TYPE_DICTIONARY and (record as Dictionary).has("timeoutMs"):
				record["timeoutMs"] = as_int_if_whole(record["timeoutMs"])
	return params


## A response's result with the integer fields of protocol.md as ints (in place; returned).
static func typed_result(method: String, result: Variant) -> Variant:
	if typeof(result) != TYPE_DICTIONARY:
		return result
	var fields: Array = RESULT_INT_FIELDS.get(method, [])
	for field: String in fields:
		if (result as Dictionary).has(field):
			result[field] = as_int_if_whole(result[field])
	if method == "npc/list" and typeof(result.get("npcs")) == TYPE_ARRAY:
		for npc: Variant in result["npcs"]:
			if typeof(npc) == TYPE_DICTIONARY:
				for field: String in ["turns", "queued"]:
					if (npc as Dictionary).has(field):
						npc[field] = as_int_if_whole(npc[field])
	return result


## value with every number a JSON Schema types "integer" turned back into an int (objects
## by "properties", "additionalProperties", arrays by "items"). Tool arguments and decision
## arguments go through this with their schema.
static func typed_by_schema(value: Variant, schema: Variant) -> Variant:
	if typeof(schema) != TYPE_DICTIONARY:
		return value
	var types: Variant = schema.get("type")
	var wants_int: bool = types == "integer" or (typeof(types) == TYPE_ARRAY and "integer" in types)
	if typeof(value) == TYPE_FLOAT:
		return as_int_if_whole(value) if wants_int else value
	if typeof(value) == TYPE_DICTIONARY:
		var properties: Dictionary = dict_or_empty(schema.get("properties"))
		var extra: Variant = schema.get("additionalProperties")
		for key: Variant in value:
			var sub: Variant = properties.get(key, extra)
			value[key] = typed_by_schema(value[key], sub)
	elif typeof(value) == TYPE_ARRAY:
		var items: Variant = schema.get("items")
		var list: Array = value
		for i in list.size():
			list[i] = typed_by_schema(list[i], items)
	return value


# --- incoming lines ---------------------------------------------------------------------


## Classifies one stdout line. The result's "kind" is one of
##   "empty"    a blank line (ignored);
##   "invalid"  not JSON, or not a response or notification ("reason", "line");
##   "response" "id" (int; -1 when the bridge could not tell, e.g. parse_error),
##              "result", and "error" ({} on success, else an error Dictionary below);
##   "event"    "method", "params" (Dictionary).
static func parse_line(line: String) -> Dictionary:
	var text := line.strip_edges()
	if text.is_empty():
		return {"kind": "empty"}
	var json := JSON.new()
	if json.parse(text) != OK:
		return {"kind": "invalid", "reason": json.get_error_message(), "line": text}
	if typeof(json.data) != TYPE_DICTIONARY:
		return {"kind": "invalid", "reason": "not a JSON object", "line": text}
	var message: Dictionary = json.data
	var out := {"kind": "invalid", "reason": "neither a response nor a notification", "line": text}
	if message.has("method") and not message.has("id"):
		var params: Variant = message.get("params")
		if typeof(params) != TYPE_DICTIONARY:
			params = {}
		out = {"kind": "event", "method": str(message["method"]), "params": params}
	elif message.has("id") and (message.has("result") or message.has("error")):
		var id := -1
		if typeof(message["id"]) == TYPE_INT or typeof(message["id"]) == TYPE_FLOAT:
			id = int(message["id"])
		var error := {}
		if typeof(message.get("error")) == TYPE_DICTIONARY:
			error = error_from_rpc(message["error"])
		out = {"kind": "response", "id": id, "result": message.get("result"), "error": error}
	return out


# --- errors: always {code, rpc_code, message, retryable, data} ---------------------------


## From a JSON-RPC error object: {"code": -31020, "message": ..., "data": {"code": ...}}.
static func error_from_rpc(rpc_error: Dictionary) -> Dictionary:
	var rpc_code := int(rpc_error.get("code", 0))
	var data: Dictionary = {}
	if typeof(rpc_error.get("data")) == TYPE_DICTIONARY:
		data = rpc_error["data"]
	var code := str(data.get("code", code_for_rpc(rpc_code)))
	return {
		"code": code,
		"rpc_code": rpc_code,
		"message": str(rpc_error.get("message", "")),
		"retryable": bool(data.get("retryable", is_retryable(code))),
		"data": data,
	}


## From a turn/failed event's "error": {"code": "cancelled", "message": ..., "retryable": ...}.
static func error_from_event(event_error: Dictionary) -> Dictionary:
	var code := str(event_error.get("code", "internal_error"))
	return {
		"code": code,
		"rpc_code": rpc_code_for(code),
		"message": str(event_error.get("message", "")),
		"retryable": bool(event_error.get("retryable", is_retryable(code))),
		"data": {},
	}


## An error made on this side (rpc_code 0), e.g. BRIDGE_CLOSED.
static func client_error(code: String, message: String) -> Dictionary:
	return {"code": code, "rpc_code": 0, "message": message, "retryable": false, "data": {}}


static func rpc_code_for(code: String) -> int:
	if ERROR_CODES.has(code):
		return ERROR_CODES[code][0]
	return 0


static func code_for_rpc(rpc_code: int) -> String:
	for code: String in ERROR_CODES:
		if ERROR_CODES[code][0] == rpc_code:
			return code
	return "internal_error"


static func is_retryable(code: String) -> bool:
	if ERROR_CODES.has(code):
		return ERROR_CODES[code][1]
	return false


# --- events -----------------------------------------------------------------------------


## The OamBridgeClient signal name and its arguments for one event; ["", []] if unknown.
## Every signal starts with (npc_id, turn_id); see oam_bridge.gd for the rest.
static func event_signal(method: String, params: Dictionary) -> Array:
	var npc_id := str(params.get("npcId", ""))
	var turn_id := str(params.get("turnId", ""))
	var call_id := str(params.get("callId", ""))
	var name := str(params.get("name", ""))
	var args: Array = [npc_id, turn_id]
	match method:
		"turn/started":
			args.append_array(
				[
					str(params.get("prompt", "")),
					text_or_empty(params.get("speaker")),
					str(params.get("kind", KIND_RESPOND))
				]
			)
		"turn/textDelta":
			args.append_array(
				[
					str(params.get("delta", "")),
					text_or_empty(params.get("text")),
					bool(params.get("isReset", false))
				]
			)
		"turn/partialJson":
			args.append_array([str(params.get("delta", "")), text_or_empty(params.get("json"))])
		"turn/toolCallRequested":
			args.append_array([call_id, name, dict_or_empty(params.get("arguments"))])
		"turn/toolCallCompleted":
			args.append_array(
				[call_id, name, params.get("output"), text_or_empty(params.get("error"))]
			)
		"turn/toolCallWithdrawn":
			args.append_array([call_id, name, str(params.get("reason", ""))])
		"turn/contextTrimmed", "turn/completed":
			args.append(params)
		"turn/failed":
			args.append(error_from_event(dict_or_empty(params.get("error"))))
	return [EVENT_SIGNALS.get(method, ""), args]


static func is_terminal(method: String) -> bool:
	return method in TERMINAL_EVENTS


## The decision_made signal's arguments from a decision turn's turn/completed params:
## [npc_id, turn_id, choice, arguments ({} for an option without parameters),
## reasoning ("" when not asked for)].
static func decision_args(params: Dictionary) -> Array:
	var answer := dict_or_empty(params.get("json"))
	return [
		str(params.get("npcId", "")),
		str(params.get("turnId", "")),
		text_or_empty(answer.get("choice")),
		dict_or_empty(answer.get("arguments")),
		text_or_empty(answer.get("reasoning")),
	]


## What a tool handler returns to answer with npc/submit's "error" instead of "output".
static func tool_error(message: String) -> Dictionary:
	return {TOOL_ERROR_KEY: message}


static func is_tool_error(value: Variant) -> bool:
	return typeof(value) == TYPE_DICTIONARY and (value as Dictionary).has(TOOL_ERROR_KEY)


static func text_or_empty(value: Variant) -> String:
	return "" if value == null else str(value)


static func dict_or_empty(value: Variant) -> Dictionary:
	return value if typeof(value) == TYPE_DICTIONARY else {}
