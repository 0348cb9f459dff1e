extends RefCounted
## One turn of an NPC (respond, decide or prewarm), to await on its own:
##   var turn := await keeper.say("Any ale left?").wait()  # keeper: an OamNpc
##   if turn.is_ok(): print(turn.text) else: print(turn.error.code)
## Finished exactly once, on the main thread: turn_completed (result), turn_failed (error),
## or the request that would start it failed (error; turn_id "").
## No class_name: preload it (const OamTurn := preload("res://addons/oam_bridge/oam_turn.gd")).

## Text as it streams (the same arguments as the client's text_delta, without the ids).
signal text_delta(delta: String, text: String, is_reset: bool)
## The turn ended (completed or failed); the argument is this turn.
signal finished_turn(turn: OamTurn)

const OamTurn := preload("oam_turn.gd")

var npc_id := ""
var turn_id := ""
## OamProtocol.KIND_RESPOND, KIND_DECIDE or KIND_PREWARM.
var kind := ""
## The text shown so far (after a reset only the new step's text); final at the end.
var text := ""
## turn/completed's params (text, json, toolCalls, usage, steps, finishReason, warnings,
## worldRevision; integers as ints); {} until it completed.
var result: Dictionary = {}
## {} unless it failed: {code, rpc_code, message, retryable, data}.
var error: Dictionary = {}
var finished := false


func _init(p_npc_id: String = "", p_kind: String = "") -> void:
	npc_id = p_npc_id
	kind = p_kind


func is_ok() -> bool:
	return finished and error.is_empty()


## The structured answer of a schema turn or a decision (turn/completed's json), else null.
func json() -> Variant:
	return result.get("json")


## Waits until the turn ended (returns at once if it has) and returns it.
func wait() -> OamTurn:
	if not finished:
		await finished_turn
	return self


## Called by the client on each text delta.
func add_delta(delta: String, full_text: String, is_reset: bool) -> void:
	if is_reset:
		text = ""
	text = full_text if not full_text.is_empty() else text + delta
	text_delta.emit(delta, full_text, is_reset)


## Called by the client; a second call is ignored.
func finish(p_result: Dictionary, p_error: Dictionary) -> void:
	if finished:
		return
	finished = true
	result = p_result
	error = p_error
	if error.is_empty():
		text = str(result.get("text", text)) if result.get("text") != null else text
	finished_turn.emit(self)
