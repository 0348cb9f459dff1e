class_name OamBridgeClient
extends Node
## Runs oam-bridge as a child process and speaks its protocol (protocol.md, version 1).
## The plugin registers one as the autoload "OamBridge"; more can be made with .new().
##
## Threading: two Threads block in FileAccess.get_line() on the bridge's stdout and
## stderr and hand every line to the main thread with call_deferred. Everything else
## (parsing, signals, tool handlers, OamCall results) runs on the main thread. Call this
## node from the main thread only; writes to the bridge's stdin happen there.

## A turn began. prompt: the player's line (a decision: the text the model reads; a prewarm:
## ""). speaker: who said it ("" for the player; another NPC's name for NPC-to-NPC lines).
## kind: OamProtocol.KIND_RESPOND, KIND_DECIDE or KIND_PREWARM, the method that started it.
signal turn_started(npc_id: String, turn_id: String, prompt: String, speaker: String, kind: String)
## New text. text: the step's text so far ("" when the turn set fullText false);
## is_reset: the text shown so far is replaced (first delta after a tool round).
signal text_delta(npc_id: String, turn_id: String, delta: String, text: String, is_reset: bool)
## Schema turns stream JSON text instead. json_text: "" when fullText is false.
signal partial_json(npc_id: String, turn_id: String, delta: String, json_text: String)
## Emitted for every call, handled by register_tool or not. Without a handler the game
## must answer with submit_output or submit_error.
signal tool_call_requested(
	npc_id: String, turn_id: String, call_id: String, name: String, arguments: Dictionary
)
## error: "" when the call produced output.
signal tool_call_completed(
	npc_id: String, turn_id: String, call_id: String, name: String, output: Variant, error: String
)
## reason: "cancelled", "timeout" or "turn_ended".
signal tool_call_withdrawn(
	npc_id: String, turn_id: String, call_id: String, name: String, reason: String
)
## info: the event's params (droppedTurns, keptTurns, promptTokens, contextSize).
signal context_trimmed(npc_id: String, turn_id: String, info: Dictionary)
## Terminal. result: the event's params (text, json, toolCalls, usage, steps, finishReason,
## warnings, worldRevision). finishReason "fallback": text is the NPC's fallback line (the
## guardrail policy caught a guardrail_violation or refusal, named in warnings);
## "retried_as_text": the retry policy's plain-text answer; "prewarmed": a prewarm's end.
## Numbers are floats, as Godot parses JSON: int(result.worldRevision).
signal turn_completed(npc_id: String, turn_id: String, result: Dictionary)
## After turn_completed of a decision (decide()): the option the NPC chose. arguments: {}
## for an option without parameters; reasoning: "" when decide() asked for none.
signal decision_made(
	npc_id: String, turn_id: String, choice: String, arguments: Dictionary, reasoning: String
)
## Terminal. error: {code, rpc_code, message, retryable, data}.
signal turn_failed(npc_id: String, turn_id: String, error: Dictionary)
## Every event, before its own signal.
signal event_received(method: String, params: Dictionary)
## One line the bridge wrote to stderr (its log).
signal stderr_line(line: String)
## The bridge closed its stdout (it exited or was killed).
signal bridge_exited

const SETTING_COMMAND := "oam_bridge/bridge/command"
const SETTING_ARGUMENTS := "oam_bridge/bridge/arguments"
const SETTING_AUTOSTART := "oam_bridge/bridge/autostart"
const SETTING_SHUTDOWN_TIMEOUT_MS := "oam_bridge/bridge/shutdown_timeout_ms"
const DEFAULT_COMMAND := "oam-bridge"
const DEFAULT_SHUTDOWN_TIMEOUT_MS := 3000
const LOG_PREFIX := "[oam-bridge] "

## Executable to start (searched in PATH), e.g. "oam-bridge" or a venv's python.
@export var command: String = DEFAULT_COMMAND
## Its arguments, e.g. ["-m", "bridge", "--engine", "scripted"].
@export var arguments: PackedStringArray = PackedStringArray()
## Start the bridge in _ready (initialize is still the game's call).
@export var autostart: bool = false
## How long stop() waits for the bridge to exit before OS.kill.
@export var shutdown_timeout_ms: int = DEFAULT_SHUTDOWN_TIMEOUT_MS
## Read the oam_bridge/bridge/* project settings in _ready (they then override the
## values above). Set false before add_child for an instance configured in code.
@export var use_project_settings: bool = true
## Print the bridge's stderr (warnings and errors go to push_warning).
@export var echo_stderr: bool = true

var _stdio: FileAccess
var _stderr: FileAccess
var _pid := -1
var _running := false
var _stdout_thread: Thread
var _stderr_thread: Thread
var _next_id := 0
var _pending := {}  # request id -> OamCall
var _tools := {}  # tool name -> Callable
var _next_seq := {}  # turn id -> the seq the next event of that turn must carry
var _turn_kinds := {}  # turn id -> its turn/started "kind", until its terminal event


func _ready() -> void:
	if use_project_settings:
		_read_project_settings()
	if autostart:
		start()


func _read_project_settings() -> void:
	command = str(ProjectSettings.get_setting(SETTING_COMMAND, command))
	arguments = PackedStringArray(ProjectSettings.get_setting(SETTING_ARGUMENTS, arguments))
	autostart = bool(ProjectSettings.get_setting(SETTING_AUTOSTART, autostart))
	shutdown_timeout_ms = int(
		ProjectSettings.get_setting(SETTING_SHUTDOWN_TIMEOUT_MS, shutdown_timeout_ms)
	)


func _exit_tree() -> void:
	stop()


func _notification(what: int) -> void:
	if what == NOTIFICATION_WM_CLOSE_REQUEST:
		stop()


# --- process ----------------------------------------------------------------------------


## Starts the bridge (the exported command/arguments unless given). True if it started.
## Needs Godot 4.3+ (OS.execute_with_pipe).
func start(p_command: String = "", p_arguments: PackedStringArray = PackedStringArray()) -> bool:
	if _running:
		push_warning(LOG_PREFIX + "already started")
		return true
	stop()  # cleans up after a bridge that exited by itself; no-op otherwise
	if not p_command.is_empty():
		command = p_command
		arguments = p_arguments
	var info := OS.execute_with_pipe(command, arguments)
	if info.is_empty():
		push_error(LOG_PREFIX + "could not start %s %s" % [command, " ".join(arguments)])
		return false
	_stdio = info["stdio"]
	_stderr = info["stderr"]
	_pid = int(info["pid"])
	_running = true
	_stdout_thread = Thread.new()
	_stdout_thread.start(_read_lines.bind(_stdio, _on_stdout_line, _on_stdout_closed))
	_stderr_thread = Thread.new()
	_stderr_thread.start(_read_lines.bind(_stderr, _on_stderr_line, Callable()))
	return true


## True while the bridge's stdout is open.
func is_running() -> bool:
	return _running


## Ends the bridge: sends the "exit" notification (the bridge cancels its turns and exits
## 0, as on stdin EOF), waits up to shutdown_timeout_ms, then OS.kill only if it is still
## running; joins the reader threads and closes the pipes. Safe to call twice.
## Godot's pipe FileAccess closes stdin and stdout together, so closing it while the reader
## thread is blocked on stdout would race; the close comes after the process is gone.
func stop() -> void:
	if _pid < 0:
		return
	if _running:
		_write_line(OamProtocol.build_notification("exit"))
	var deadline := Time.get_ticks_msec() + shutdown_timeout_ms
	while OS.is_process_running(_pid) and Time.get_ticks_msec() < deadline:
		OS.delay_msec(10)
	if OS.is_process_running(_pid):
		push_warning(LOG_PREFIX + "bridge did not exit in %d ms; killing it" % shutdown_timeout_ms)
		OS.kill(_pid)
	var stdout_joined := _join(_stdout_thread)
	var joined := _join(_stderr_thread) and stdout_joined
	_stdout_thread = null
	_stderr_thread = null
	if joined:
		_stdio.close()
		_stderr.close()
	else:
		push_warning(LOG_PREFIX + "a reader thread is still blocked; leaving its pipe open")
	_stdio = null
	_stderr = null
	_pid = -1
	_mark_closed()


# --- requests ---------------------------------------------------------------------------


## Sends any request; the returned OamCall finishes with its response.
func request(method: String, params: Dictionary = {}) -> OamCall:
	_next_id += 1
	var pending_call := OamCall.new(method, _next_id)
	if _running and _write_line(OamProtocol.build_request(_next_id, method, params)):
		_pending[_next_id] = pending_call
	else:
		var error := OamProtocol.client_error(OamProtocol.BRIDGE_CLOSED, "bridge is not running")
		# Deferred so the caller can await first; as an argument the call stays referenced.
		_finish_call.call_deferred(pending_call, null, error)
	return pending_call


## Sends a notification (no response), e.g. "exit".
func notify(method: String, params: Dictionary = {}) -> void:
	if _running:
		_write_line(OamProtocol.build_notification(method, params))


func initialize(client_name: String = "godot", client_version: String = "1") -> OamCall:
	return request("initialize", OamProtocol.initialize_params(client_name, client_version))


## config: instructions, persona, tools (see OamProtocol.tool_spec), engine, model, options,
## tags (world facts scoped by tag reach it), fallbacks (see OamProtocol.fallbacks), script.
func create_npc(npc_id: String, config: Dictionary = {}) -> OamCall:
	return request("npc/create", OamProtocol.create_params(npc_id, config))


## Starts a turn; the result is {npcId, turnId}, then the turn's signals follow.
## options: toolChoice (also OamProtocol.TOOL_CHOICE_TOOL_OR_ANSWER), maxToolRounds,
## maxToolCalls, schema, toolTimeoutMs, fullText, speaker (another NPC's id or a name: who
## says the prompt; absent: the player), guardrail (OamProtocol.GUARDRAIL_*).
func respond(npc_id: String, prompt: String, options: Dictionary = {}) -> OamCall:
	return request("npc/respond", OamProtocol.respond_params(npc_id, prompt, options))


func submit_output(npc_id: String, call_id: String, output: Variant) -> OamCall:
	return request("npc/submit", OamProtocol.submit_output_params(npc_id, call_id, output))


func submit_error(npc_id: String, call_id: String, message: String) -> OamCall:
	return request("npc/submit", OamProtocol.submit_error_params(npc_id, call_id, message))


func cancel(npc_id: String) -> OamCall:
	return request("npc/cancel", OamProtocol.npc_params(npc_id))


## The result is the NPC's save: store it as it is, give it back to restore().
func get_transcript(npc_id: String) -> OamCall:
	return request("npc/transcript", OamProtocol.npc_params(npc_id))


func restore(save: Dictionary, npc_id: String = "") -> OamCall:
	return request("npc/restore", OamProtocol.restore_params(save, npc_id))


func reset(npc_id: String) -> OamCall:
	return request("npc/reset", OamProtocol.npc_params(npc_id))


func delete_npc(npc_id: String) -> OamCall:
	return request("npc/delete", OamProtocol.npc_params(npc_id))


func list_npcs() -> OamCall:
	return request("npc/list")


func count_tokens(text: String, npc_id: String = "", engine: String = "") -> OamCall:
	return request("tokens/count", OamProtocol.count_tokens_params(text, npc_id, engine))


func engine_status() -> OamCall:
	return request("engine/status")


## Ends every turn; afterwards only "exit" is accepted (stop() sends it).
func shutdown() -> OamCall:
	return request("shutdown")


# --- game layer -------------------------------------------------------------------------


## The NPC picks one of options (OamProtocol.decision_option) for the situation. The result
## is {npcId, turnId}; the decision is a turn of the NPC (turn_started kind "decide",
## partial_json, then turn_completed with json {reasoning, choice, arguments}), followed by
## decision_made. reasoning: the model says why before it chooses; remember: the decision
## enters the NPC's dialogue history.
func decide(
	npc_id: String, situation: String, options: Array, reasoning := true, remember := false
) -> OamCall:
	return request(
		"npc/decide", OamProtocol.decide_params(npc_id, situation, options, reasoning, remember)
	)


## Prepares the NPC before the player reaches it, so its first words come sooner. The result
## is {npcId, turnId}; the prewarm is a turn (turn_started kind "prewarm", then
## turn_completed with finishReason "prewarmed").
func prewarm(npc_id: String) -> OamCall:
	return request("npc/prewarm", OamProtocol.npc_params(npc_id))


## Replaces the NPC's tags (where it is, whose side it is on): the world facts scoped by
## tag that it sees follow from its next model step. The result is {}.
func set_tags(npc_id: String, tags: PackedStringArray) -> OamCall:
	return request("npc/setTags", OamProtocol.set_tags_params(npc_id, tags))


## Sets a world fact (value: any JSON but null), replacing one with that key. tags and
## npc_ids scope it (both empty: every NPC sees it); lore keeps it out of the prompts and
## lets the NPCs that can see it look it up with the bridge's recall tool. The result is
## {revision}.
func world_set(
	key: String,
	value: Variant,
	tags := PackedStringArray(),
	npc_ids := PackedStringArray(),
	lore := false
) -> OamCall:
	return request("world/set", OamProtocol.world_set_params(key, value, tags, npc_ids, lore))


## The result is {revision, deleted} (deleted false: there was no such fact).
func world_delete(key: String) -> OamCall:
	return request("world/delete", OamProtocol.world_key_params(key))


## The result is {revision, facts} (each key, value, npcIds, tags, lore; sorted by key):
## every fact, or with npc_id only those that NPC can see. Keep it in the save data and
## world_set the facts again after loading.
func world_get(npc_id: String = "") -> OamCall:
	return request("world/get", OamProtocol.world_get_params(npc_id))


# --- tools ------------------------------------------------------------------------------


## handler(arguments: Dictionary) or handler(arguments: Dictionary, call: Dictionary)
## where call is the turn/toolCallRequested params (npcId, turnId, callId, name, ...).
## It may be a coroutine (use await inside). What it returns is submitted as the output;
## return OamBridgeClient.tool_error("why") to submit an error instead, or null to answer
## later yourself with submit_output/submit_error.
func register_tool(tool_name: String, handler: Callable) -> void:
	_tools[tool_name] = handler


func unregister_tool(tool_name: String) -> void:
	_tools.erase(tool_name)


static func tool_error(message: String) -> Dictionary:
	return OamProtocol.tool_error(message)


# --- internals --------------------------------------------------------------------------


func _write_line(line: String) -> bool:
	if _stdio == null:
		return false
	_stdio.store_line(line)
	_stdio.flush()
	return true


# Runs on a reader thread: touches only its own pipe, hands lines over with call_deferred.
func _read_lines(pipe: FileAccess, on_line: Callable, on_closed: Callable) -> void:
	while true:
		var line := pipe.get_line()
		var at_end := pipe.get_error() != OK
		if not line.is_empty():
			on_line.call_deferred(line)
		if at_end:
			break
	if on_closed.is_valid():
		on_closed.call_deferred()


func _on_stdout_line(line: String) -> void:
	var message := OamProtocol.parse_line(line)
	match message["kind"]:
		"response":
			_on_response(message)
		"event":
			_on_event(message["method"], message["params"])
		"invalid":
			push_warning(LOG_PREFIX + "ignored line (%s): %s" % [message["reason"], line])


func _on_response(message: Dictionary) -> void:
	var id: int = message["id"]
	if not _pending.has(id):
		push_warning(LOG_PREFIX + "response to no pending request: %s" % [message])
		return
	var pending_call: OamCall = _pending[id]
	_pending.erase(id)
	pending_call.finish(message["result"], message["error"])


func _on_event(method: String, params: Dictionary) -> void:
	_check_seq(method, params)
	var kind := _turn_kind(method, params)
	event_received.emit(method, params)
	var mapped := OamProtocol.event_signal(method, params)
	var signal_name: String = mapped[0]
	if signal_name.is_empty():
		push_warning(LOG_PREFIX + "unknown event %s" % method)
		return
	var args: Array = [signal_name]
	args.append_array(mapped[1])
	callv("emit_signal", args)
	if method == "turn/toolCallRequested":
		_run_tool(params)
	elif method == "turn/completed" and kind == OamProtocol.KIND_DECIDE:
		callv("emit_signal", ["decision_made"] + OamProtocol.decision_args(params))


# Remembers each turn's kind from turn/started; returns it (forgotten at the terminal event).
func _turn_kind(method: String, params: Dictionary) -> String:
	var turn_id := str(params.get("turnId", ""))
	if method == "turn/started":
		_turn_kinds[turn_id] = str(params.get("kind", OamProtocol.KIND_RESPOND))
	var kind: String = _turn_kinds.get(turn_id, "")
	if OamProtocol.is_terminal(method):
		_turn_kinds.erase(turn_id)
	return kind


func _check_seq(method: String, params: Dictionary) -> void:
	var turn_id := str(params.get("turnId", ""))
	var seq := int(params.get("seq", -1))
	var expected: int = _next_seq.get(turn_id, 0)
	if seq != expected:
		push_warning(LOG_PREFIX + "turn %s: seq %d, expected %d" % [turn_id, seq, expected])
	_next_seq[turn_id] = seq + 1
	if OamProtocol.is_terminal(method):
		_next_seq.erase(turn_id)


func _run_tool(params: Dictionary) -> void:
	var tool_name := str(params.get("name", ""))
	if not _tools.has(tool_name):
		return
	var handler: Callable = _tools[tool_name]
	var arguments := OamProtocol.dict_or_empty(params.get("arguments"))
	var npc_id := str(params.get("npcId", ""))
	var call_id := str(params.get("callId", ""))
	var output: Variant = null
	if handler.get_argument_count() >= 2:
		output = await handler.call(arguments, params)
	else:
		output = await handler.call(arguments)
	if output == null:
		return  # the handler answers later itself
	var submitted: OamCall
	if OamProtocol.is_tool_error(output):
		submitted = submit_error(npc_id, call_id, str(output[OamProtocol.TOOL_ERROR_KEY]))
	else:
		submitted = submit_output(npc_id, call_id, output)
	var answer: Array = await submitted.done
	var error: Dictionary = answer[1]
	# unknown_tool_call: the call timed out or was withdrawn while the handler ran.
	if not error.is_empty() and error["code"] != "unknown_tool_call":
		push_warning(LOG_PREFIX + "submit for %s failed: %s" % [tool_name, error["message"]])


func _finish_call(pending_call: OamCall, result: Variant, error: Dictionary) -> void:
	pending_call.finish(result, error)


func _on_stderr_line(line: String) -> void:
	stderr_line.emit(line)
	if not echo_stderr:
		return
	if "ERROR" in line or "WARNING" in line or "Traceback" in line:
		push_warning(LOG_PREFIX + line)
	else:
		print(LOG_PREFIX + line)


func _on_stdout_closed() -> void:
	_mark_closed()


# The bridge is gone: fail what is still waiting, once.
func _mark_closed() -> void:
	if not _running and _pending.is_empty():
		return
	_running = false
	var waiting := _pending.values()
	_pending.clear()
	_next_seq.clear()
	_turn_kinds.clear()
	for pending_call: OamCall in waiting:
		pending_call.finish(
			null, OamProtocol.client_error(OamProtocol.BRIDGE_CLOSED, "bridge exited")
		)
	bridge_exited.emit()


# Joins a reader thread, waiting at most a second; false if it is still blocked.
func _join(thread: Thread) -> bool:
	if thread == null:
		return true
	var deadline := Time.get_ticks_msec() + 1000
	while thread.is_alive() and Time.get_ticks_msec() < deadline:
		OS.delay_msec(5)
	if thread.is_alive():
		return false
	thread.wait_to_finish()
	return true
