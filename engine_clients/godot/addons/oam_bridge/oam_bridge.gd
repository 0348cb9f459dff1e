extends Node
## Runs oam-bridge as a child process and speaks its protocol (protocol.md, version 1).
## The plugin registers one as the autoload "OamBridge"; more can be made with
## preload("res://addons/oam_bridge/oam_bridge.gd").new(). No class_name: every file of the
## addon is reached by preload, so a project without the editor's class cache (a fresh
## checkout, a CI run) loads it.
##
## Threading: two Threads read the bridge's stdout and stderr in blocks (64 KiB), split the
## lines and parse the JSON there, and hand each message to the main thread with
## call_deferred. Signals, tool handlers, OamCall and OamTurn results run on the main thread.
## Call this node from the main thread only; writes to the bridge's stdin happen there.

## A turn began. prompt: the player's line (a decision: the text the model reads; a prewarm:
## its prompt_prefix). speaker: who said it ("" for the player; another NPC's name for
## NPC-to-NPC lines; a prewarm: who will speak next). kind: OamProtocol.KIND_RESPOND,
## KIND_DECIDE or KIND_PREWARM, the method that started it.
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
## The integers of protocol.md (seq, steps, worldRevision, usage's counts) are ints.
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
## The bridge closed its stdout (it exited or was killed); exit_code and last_error say more.
## A bridge that dies before answering initialize (a wrong command, a crash at start-up) also
## fails the initialize call with code bridge_closed and that message.
signal bridge_exited

const OamProtocol := preload("oam_protocol.gd")
const OamCall := preload("oam_call.gd")
const OamTurn := preload("oam_turn.gd")

const SETTING_COMMAND := "oam_bridge/bridge/command"
const SETTING_ARGUMENTS := "oam_bridge/bridge/arguments"
const SETTING_AUTOSTART := "oam_bridge/bridge/autostart"
const SETTING_SHUTDOWN_TIMEOUT_MS := "oam_bridge/bridge/shutdown_timeout_ms"
const DEFAULT_COMMAND := "oam-bridge"
const DEFAULT_SHUTDOWN_TIMEOUT_MS := 3000
const LOG_PREFIX := "[oam-bridge] "
## Bytes per read from the bridge's pipes (one system call each).
const READ_CHUNK := 65536

## Executable to start (searched in PATH), e.g. "oam-bridge" or a venv's python.
## A shipped game: see shipped_bridge_path() and the README's "Shipping your game".
@export var command: String = DEFAULT_COMMAND
## Its arguments, e.g. ["-m", "bridge", "--engine", "scripted"].
@export var arguments: PackedStringArray = PackedStringArray()
## Start the bridge in _ready (initialize is still the game's call).
@export var autostart: bool = false
## How long after stop() the bridge may take to exit before OS.kill (stop() does not wait).
@export var shutdown_timeout_ms: int = DEFAULT_SHUTDOWN_TIMEOUT_MS
## Read the oam_bridge/bridge/* project settings in _ready (they then override the
## values above). Set false before add_child for an instance configured in code.
@export var use_project_settings: bool = true
## Print the bridge's stderr (warnings and errors go to push_warning).
@export var echo_stderr: bool = true

## Why the last start() failed or the bridge ended unexpectedly ("" if it did not).
var last_error := ""
## The bridge's exit code once it exited and was reaped (-1 before).
var exit_code := -1
## Lines written to the bridge (requests and notifications).
var lines_written := 0

var _stdio: FileAccess
var _stderr: FileAccess
var _pid := -1
var _running := false
var _answered := false  # the bridge answered a request: it started
var _stdout_thread: Thread
var _stderr_thread: Thread
var _closing: Array[Dictionary] = []  # bridges being stopped: pid, pipes, threads, deadline
var _next_id := 0
var _pending := {}  # request id -> OamCall
var _tools := {}  # tool name -> Callable
var _npc_tools := {}  # npc id -> {tool name -> Callable}
var _tool_schemas := {}  # npc id -> {tool name -> parameters schema}
var _npc_nodes := {}  # npc id -> OamNpc node (events also go to it)
var _turns := {}  # turn id -> OamTurn
var _decide_options := {}  # turn id -> the decision's options (their parameter schemas)
var _next_seq := {}  # turn id -> the seq the next event of that turn must carry
var _turn_kinds := {}  # turn id -> its turn/started "kind", until its terminal event


func _ready() -> void:
	set_process(false)
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
	_finish_closing(true)


func _notification(what: int) -> void:
	if what == NOTIFICATION_WM_CLOSE_REQUEST:
		stop()
		_finish_closing(true)
	elif what == NOTIFICATION_PREDELETE:
		_finish_closing(true)


func _process(_delta: float) -> void:
	_finish_closing(false)
	if _closing.is_empty():
		set_process(false)


# --- process ----------------------------------------------------------------------------


## Where a shipped bridge lives: `<folder of the game executable>/oam-bridge/oam-bridge`
## (.exe on Windows) in an exported game; in the editor (or a run from the editor),
## editor_path (a res:// or absolute path) made absolute, e.g. "res://../../dist/oam-bridge/
## oam-bridge". See the README's "Shipping your game".
static func shipped_bridge_path(editor_path: String = "") -> String:
	var exe_name := "oam-bridge.exe" if OS.get_name() == "Windows" else "oam-bridge"
	if OS.has_feature("editor") and not editor_path.is_empty():
		return ProjectSettings.globalize_path(editor_path).simplify_path()
	return OS.get_executable_path().get_base_dir().path_join("oam-bridge").path_join(exe_name)


## Starts the bridge (the exported command/arguments unless given). False, with last_error
## and an error printed, when the command cannot be found or run. It does not wait for the
## bridge: a bridge that dies before it answers initialize fails that call (bridge_closed,
## with the exit code in the message) and emits bridge_exited.
## Needs Godot 4.3+ (OS.execute_with_pipe); 4.5.2+ advised (see the README on SIGPIPE).
func start(p_command: String = "", p_arguments: PackedStringArray = PackedStringArray()) -> bool:
	if is_running():
		push_warning(LOG_PREFIX + "already started")
		return true
	stop()  # cleans up after a bridge that exited by itself; no-op otherwise
	if not p_command.is_empty():
		command = p_command
		arguments = p_arguments
	last_error = ""
	exit_code = -1
	var missing := _command_problem(command)
	if not missing.is_empty():
		return _start_failed(missing)
	var info := OS.execute_with_pipe(command, arguments)
	if info.is_empty():
		return _start_failed("could not start %s" % _command_line())
	_stdio = info["stdio"]
	_stderr = info["stderr"]
	_pid = int(info["pid"])
	_running = true
	_answered = false
	_stdout_thread = Thread.new()
	_stdout_thread.start(_read_messages.bind(_stdio, _pid))
	_stderr_thread = Thread.new()
	_stderr_thread.start(_read_stderr.bind(_stderr))
	return true


## True while the bridge runs and its stdout is open.
func is_running() -> bool:
	if _running and _pid >= 0 and not OS.is_process_running(_pid):
		_on_stdout_closed(_pid)  # it died; the reader thread's notice may still be queued
	return _running


## The bridge's process id (-1 when none).
func get_pid() -> int:
	return _pid


## Ends the bridge without blocking the game: sends the "exit" notification (the bridge
## cancels its turns and exits 0, as on stdin EOF) and returns at once. Pending calls fail
## with bridge_closed now; the process is watched from _process: OS.kill after
## shutdown_timeout_ms if it is still running, then the reader threads are joined and the
## pipes closed. When the node leaves the tree or the game quits, a bridge still running
## gets OS.kill at once (it was already told to exit), so quitting does not wait either.
## Safe to call twice.
func stop() -> void:
	if _pid < 0:
		return
	if is_running():
		_write_line(OamProtocol.build_notification("exit"))
	(
		_closing
		. append(
			{
				"pid": _pid,
				"stdio": _stdio,
				"stderr": _stderr,
				"threads": [_stdout_thread, _stderr_thread],
				"deadline": Time.get_ticks_msec() + shutdown_timeout_ms,
			}
		)
	)
	_stdio = null
	_stderr = null
	_stdout_thread = null
	_stderr_thread = null
	_pid = -1
	_mark_closed()
	if is_inside_tree():
		set_process(true)
	else:
		_finish_closing(true)


# Reaps stopped bridges. now: kill what still runs and join at once (quitting); otherwise
# only what has ended or passed its deadline, never waiting.
func _finish_closing(now: bool) -> void:
	var still: Array[Dictionary] = []
	for entry: Dictionary in _closing:
		var pid: int = entry["pid"]
		var running := OS.is_process_running(pid)
		if running and (now or Time.get_ticks_msec() >= int(entry["deadline"])):
			if not now:
				push_warning(LOG_PREFIX + "bridge did not exit in time; killing it")
			OS.kill(pid)
		var threads_alive := false
		for thread: Thread in entry["threads"]:
			threads_alive = threads_alive or (thread != null and thread.is_alive())
		if threads_alive and now:
			threads_alive = not _wait_threads(entry["threads"], 500)
		if threads_alive:
			still.append(entry)
			continue
		for thread: Thread in entry["threads"]:
			if thread != null:
				thread.wait_to_finish()
		for pipe: FileAccess in [entry["stdio"], entry["stderr"]]:
			if pipe != null:
				pipe.close()
	_closing = still


# After OS.kill the pipes reach EOF at once; waits at most max_ms for the readers to see it.
func _wait_threads(threads: Array, max_ms: int) -> bool:
	var deadline := Time.get_ticks_msec() + max_ms
	while Time.get_ticks_msec() < deadline:
		var alive := false
		for thread: Thread in threads:
			alive = alive or (thread != null and thread.is_alive())
		if not alive:
			return true
		OS.delay_msec(1)
	push_warning(LOG_PREFIX + "a reader thread is still blocked; leaving its pipe open")
	return false


func _command_line() -> String:
	return ("%s %s" % [command, " ".join(arguments)]).strip_edges()


func _start_failed(message: String) -> bool:
	last_error = message
	push_error(LOG_PREFIX + message)
	return false


# Why the command cannot run, or "". On Linux and macOS Godot forks before it execs, so a
# missing command would look started: look it up first, as execvp would.
func _command_problem(cmd: String) -> String:
	if cmd.is_empty():
		return "no bridge command set"
	if OS.get_name() == "Windows":
		return ""  # CreateProcess fails at once there: execute_with_pipe returns {}
	if "/" in cmd:
		if cmd.is_absolute_path() and not FileAccess.file_exists(cmd):
			return "bridge command not found: %s" % cmd
		return ""
	for dir: String in OS.get_environment("PATH").split(":", false):
		if FileAccess.file_exists(dir.path_join(cmd)):
			return ""
	return "bridge command not found in PATH: %s" % cmd


# --- requests ---------------------------------------------------------------------------


## Sends any request; the returned OamCall finishes with its response.
func request(method: String, params: Dictionary = {}) -> OamCall:
	_next_id += 1
	var pending_call := OamCall.new(method, _next_id)
	if method in ["npc/respond", "npc/decide", "npc/prewarm"]:
		var kind := {"npc/respond": "respond", "npc/decide": "decide", "npc/prewarm": "prewarm"}
		pending_call.turn = OamTurn.new(str(params.get("npcId", "")), kind[method])
		if method == "npc/decide":
			pending_call.set_meta("options", params.get("options", []))
	if method == "npc/create":
		_remember_tools(str(params.get("npcId", "")), params.get("tools"))
	elif method == "npc/restore" and typeof(params.get("save")) == TYPE_DICTIONARY:
		var config: Dictionary = OamProtocol.dict_or_empty(params["save"].get("config"))
		_remember_tools(str(params.get("npcId", config.get("npcId", ""))), config.get("tools"))
	if is_running() and _write_line(OamProtocol.build_request(_next_id, method, params)):
		_pending[_next_id] = pending_call
	else:
		if _running and _pid >= 0:
			# It died between is_running() and the write: say how (its exit code), as
			# is_running() would have a moment later.
			_on_stdout_closed(_pid)
		var message := "bridge is not running" if last_error.is_empty() else last_error
		var error := OamProtocol.client_error(OamProtocol.BRIDGE_CLOSED, message)
		# Deferred so the caller can await first; as an argument the call stays referenced.
		_finish_call.call_deferred(pending_call, null, error)
	return pending_call


## Sends a notification (no response), e.g. "exit".
func notify(method: String, params: Dictionary = {}) -> void:
	if is_running():
		_write_line(OamProtocol.build_notification(method, params))


func initialize(client_name: String = "godot", client_version: String = "1") -> OamCall:
	return request("initialize", OamProtocol.initialize_params(client_name, client_version))


## config: instructions, persona, tools (see tool() and OamProtocol.tool_spec), engine, model,
## options, tags (world facts scoped by tag reach it), fallbacks (see OamProtocol.fallbacks),
## script.
func create_npc(npc_id: String, config: Dictionary = {}) -> OamCall:
	return request("npc/create", OamProtocol.create_params(npc_id, config))


## Starts a turn; the result is {npcId, turnId}, then the turn's signals follow. The call's
## turn (an OamTurn) finishes with the turn: await OamBridge.respond(...).turn.wait().
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
## turn_completed with finishReason "prewarmed"). When the game knows who will speak to the
## NPC next (speaker: another NPC's id or a name; "": the player) or how that line starts
## (prompt_prefix), that lead-in is prepared too.
func prewarm(npc_id: String, speaker: String = "", prompt_prefix: String = "") -> OamCall:
	return request("npc/prewarm", OamProtocol.prewarm_params(npc_id, speaker, prompt_prefix))


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


## Declares a tool once: registers handler and returns its definition for npc/create's
## "tools". The name is the handler's method name unless given (a lambda needs one);
## parameters: an object schema, or a Dictionary of properties (all required).
##   "tools": [OamBridge.tool(_check_inventory, "Count an item", {"item": {"type": "string"}})]
func tool(
	handler: Callable, description: String, parameters: Dictionary = {}, tool_name: String = ""
) -> Dictionary:
	var spec := OamProtocol.tool_from_callable(handler, description, parameters, tool_name)
	register_tool(spec["name"], handler)
	return spec


## handler(arguments: Dictionary) or handler(arguments: Dictionary, call: Dictionary)
## where call is the turn/toolCallRequested params (npcId, turnId, callId, name, ...).
## It may be a coroutine (use await inside). What it returns is submitted as the output;
## return tool_error("why") to submit an error instead, or null to answer later yourself
## with submit_output/submit_error. Arguments the tool's schema types "integer" arrive as
## ints. npc_id: only for that NPC (an OamNpc's tools); "" for every NPC.
func register_tool(tool_name: String, handler: Callable, npc_id: String = "") -> void:
	if npc_id.is_empty():
		_tools[tool_name] = handler
	else:
		if not _npc_tools.has(npc_id):
			_npc_tools[npc_id] = {}
		_npc_tools[npc_id][tool_name] = handler


func unregister_tool(tool_name: String, npc_id: String = "") -> void:
	if npc_id.is_empty():
		_tools.erase(tool_name)
	elif _npc_tools.has(npc_id):
		_npc_tools[npc_id].erase(tool_name)


static func tool_error(message: String) -> Dictionary:
	return OamProtocol.tool_error(message)


## An OamNpc registers itself here: the events of its turns also go to it.
func attach_npc(npc_id: String, npc: Node) -> void:
	_npc_nodes[npc_id] = npc


func detach_npc(npc_id: String, npc: Node) -> void:
	if _npc_nodes.get(npc_id) == npc:
		_npc_nodes.erase(npc_id)
	_npc_tools.erase(npc_id)


# --- internals --------------------------------------------------------------------------


# Never writes to a bridge that has exited: on Godot 4.3.0 to 4.5.1 a write to a pipe with no
# reader kills the game with SIGPIPE (fixed in 4.5.2, godotengine/godot#111114).
func _write_line(line: String) -> bool:
	if _stdio == null or _pid < 0 or not OS.is_process_running(_pid):
		return false
	_stdio.store_string(line + "\n")
	_stdio.flush()
	lines_written += 1
	return true


func _remember_tools(npc_id: String, tools: Variant) -> void:
	if typeof(tools) != TYPE_ARRAY:
		return
	var schemas := {}
	for spec: Variant in tools:
		if typeof(spec) == TYPE_DICTIONARY:
			schemas[str(spec.get("name", ""))] = spec.get("parameters", {})
	_tool_schemas[npc_id] = schemas


# Runs on the stdout thread: reads blocks, splits lines, parses them, and hands each message
# to the main thread. Touches only its own pipe.
func _read_messages(pipe: FileAccess, pid: int) -> void:
	var buffer := PackedByteArray()
	while true:
		var chunk := pipe.get_buffer(READ_CHUNK)
		if chunk.is_empty():
			break
		buffer = _split_lines(buffer, chunk, pid)
	if not buffer.is_empty():
		_deliver_line(buffer.get_string_from_utf8(), pid)
	_on_stdout_closed.call_deferred(pid)


func _read_stderr(pipe: FileAccess) -> void:
	var buffer := PackedByteArray()
	while true:
		var chunk := pipe.get_buffer(READ_CHUNK)
		if chunk.is_empty():
			break
		buffer = _split_lines(buffer, chunk, -1)
	if not buffer.is_empty():
		_deliver_line(buffer.get_string_from_utf8(), -1)


# Appends chunk to buffer, delivers every complete line, returns the incomplete rest.
# pid: the bridge whose stdout this is (-1: a stderr line, not parsed).
func _split_lines(buffer: PackedByteArray, chunk: PackedByteArray, pid: int) -> PackedByteArray:
	var newline := chunk.find(10)
	if newline < 0:
		buffer.append_array(chunk)
		return buffer
	buffer.append_array(chunk.slice(0, newline))
	_deliver_line(buffer.get_string_from_utf8(), pid)
	var from := newline + 1
	newline = chunk.find(10, from)
	while newline >= 0:
		_deliver_line(chunk.slice(from, newline).get_string_from_utf8(), pid)
		from = newline + 1
		newline = chunk.find(10, from)
	return chunk.slice(from)


func _deliver_line(line: String, pid: int) -> void:
	if pid < 0:
		if not line.is_empty():
			_on_stderr_line.call_deferred(line)
		return
	var message := OamProtocol.parse_line(line)
	if message["kind"] != "empty":
		_on_message.call_deferred(message, pid)


# A message from bridge pid; one from a bridge already stopped is dropped.
func _on_message(message: Dictionary, pid: int) -> void:
	if pid != _pid:
		return
	match message["kind"]:
		"response":
			_answered = true
			_on_response(message)
		"event":
			_on_event(message["method"], message["params"])
		"invalid":
			push_warning(
				LOG_PREFIX + "ignored line (%s): %s" % [message["reason"], message["line"]]
			)


func _on_response(message: Dictionary) -> void:
	var id: int = message["id"]
	if not _pending.has(id):
		push_warning(LOG_PREFIX + "response to no pending request: %s" % [message])
		return
	var pending_call: OamCall = _pending[id]
	_pending.erase(id)
	var result: Variant = OamProtocol.typed_result(pending_call.method, message["result"])
	var error: Dictionary = message["error"]
	if pending_call.turn != null:
		if error.is_empty() and typeof(result) == TYPE_DICTIONARY:
			pending_call.turn.turn_id = str(result.get("turnId", ""))
			_turns[pending_call.turn.turn_id] = pending_call.turn
			if pending_call.has_meta("options"):
				_decide_options[pending_call.turn.turn_id] = pending_call.get_meta("options")
		else:
			pending_call.turn.finish({}, error)
	pending_call.finish(result, error)


func _on_event(method: String, params: Dictionary) -> void:
	OamProtocol.typed_event(method, params)
	var turn_id := str(params.get("turnId", ""))
	var npc_id := str(params.get("npcId", ""))
	if method == "turn/toolCallRequested":
		var schemas: Dictionary = _tool_schemas.get(npc_id, {})
		var schema: Variant = schemas.get(str(params.get("name", "")))
		params["arguments"] = OamProtocol.typed_by_schema(params.get("arguments"), schema)
	elif method == "turn/completed":
		_type_tool_records(npc_id, params.get("toolCalls"))
		if _decide_options.has(turn_id):
			_type_decision(params, _decide_options[turn_id])
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
	var npc: Node = _npc_nodes.get(npc_id)
	if npc != null and is_instance_valid(npc):
		npc.call("_on_bridge_event", method, params, mapped[1])
	var turn: OamTurn = _turns.get(turn_id)
	if turn != null and method == "turn/textDelta":
		turn.add_delta(mapped[1][2], mapped[1][3], mapped[1][4])
	if method == "turn/toolCallRequested":
		_run_tool(params)
	elif method == "turn/completed" and kind == OamProtocol.KIND_DECIDE:
		var decision := OamProtocol.decision_args(params)
		callv("emit_signal", ["decision_made"] + decision)
		if npc != null and is_instance_valid(npc):
			npc.call("_on_decision", decision)
	if OamProtocol.is_terminal(method):
		_decide_options.erase(turn_id)
		_turns.erase(turn_id)
		if turn != null:
			if method == "turn/completed":
				turn.finish(params, {})
			else:
				turn.finish(params, mapped[1][2])


# turn/completed's toolCalls: each call's arguments typed by its tool's schema.
func _type_tool_records(npc_id: String, records: Variant) -> void:
	if typeof(records) != TYPE_ARRAY:
		return
	var schemas: Dictionary = _tool_schemas.get(npc_id, {})
	for record: Variant in records:
		if typeof(record) == TYPE_DICTIONARY and schemas.has(record.get("name")):
			record["arguments"] = OamProtocol.typed_by_schema(
				record.get("arguments"), schemas[record["name"]]
			)


# A decision's arguments typed by the chosen option's parameter schema.
func _type_decision(params: Dictionary, options: Variant) -> void:
	var answer: Variant = params.get("json")
	if typeof(answer) != TYPE_DICTIONARY or typeof(options) != TYPE_ARRAY:
		return
	for option: Variant in options:
		if typeof(option) == TYPE_DICTIONARY and option.get("name") == answer.get("choice"):
			answer["arguments"] = OamProtocol.typed_by_schema(
				answer.get("arguments"), option.get("parameters")
			)


# Remembers each turn's kind from turn/started; returns it (forgotten at the terminal event).
func _turn_kind(method: String, params: Dictionary) -> String:
	var turn_id := str(params.get("turnId", ""))
	if method == "turn/started":
		_turn_kinds[turn_id] = str(params.get("kind", OamProtocol.KIND_RESPOND))
		var turn: OamTurn = _turns.get(turn_id)
		if turn != null:
			turn.kind = _turn_kinds[turn_id]
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
	var npc_id := str(params.get("npcId", ""))
	var npc_tools: Dictionary = _npc_tools.get(npc_id, {})
	var handler: Callable = npc_tools.get(tool_name, _tools.get(tool_name, Callable()))
	if not handler.is_valid():
		return
	var arguments := OamProtocol.dict_or_empty(params.get("arguments"))
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
	if not error.is_empty() and error["code"] not in ["unknown_tool_call", "bridge_closed"]:
		push_warning(LOG_PREFIX + "submit for %s failed: %s" % [tool_name, error["message"]])


func _finish_call(pending_call: OamCall, result: Variant, error: Dictionary) -> void:
	if pending_call.turn != null:
		pending_call.turn.finish({}, error)
	pending_call.finish(result, error)


func _on_stderr_line(line: String) -> void:
	stderr_line.emit(line)
	if not echo_stderr:
		return
	if "ERROR" in line or "WARNING" in line or "Traceback" in line:
		push_warning(LOG_PREFIX + line)
	else:
		print(LOG_PREFIX + line)


# The stdout of bridge pid closed (or is_running() found it dead).
func _on_stdout_closed(pid: int) -> void:
	if pid != _pid or not _running:
		return
	# Its stdout closed because it is exiting: wait (at most 50 ms) for the exit code.
	var deadline := Time.get_ticks_msec() + 50
	while OS.is_process_running(pid) and Time.get_ticks_msec() < deadline:
		OS.delay_msec(1)
	if not OS.is_process_running(pid):
		exit_code = OS.get_process_exit_code(pid)
	if not _answered:
		last_error = (
			"the bridge exited before it answered (exit code %d): is the command right? %s"
			% [exit_code, _command_line()]
		)
		push_error(LOG_PREFIX + last_error)
	elif exit_code != 0 and last_error.is_empty():
		last_error = "the bridge exited (exit code %d)" % exit_code
	_mark_closed()


# The bridge is gone: fail what is still waiting, once.
func _mark_closed() -> void:
	if not _running and _pending.is_empty():
		return
	_running = false
	var waiting := _pending.values()
	var turns := _turns.values()
	_pending.clear()
	_turns.clear()
	_decide_options.clear()
	_next_seq.clear()
	_turn_kinds.clear()
	var message := "bridge exited" if last_error.is_empty() else last_error
	var error := OamProtocol.client_error(OamProtocol.BRIDGE_CLOSED, message)
	for pending_call: OamCall in waiting:
		_finish_call(pending_call, null, error)
	for turn: OamTurn in turns:
		turn.finish({}, error)
	bridge_exited.emit()
