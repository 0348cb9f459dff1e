extends RefCounted
## One request in flight. Finished exactly once, on the main thread, never before the
## caller could connect:
##   var call := await bridge.create_npc("keeper", config).wait()
##   if call.is_ok(): print(call.result) else: print(call.error.code)
## or, with the raw signal:  var pair: Array = await call.done  # [result, error]
## respond(), decide() and prewarm() calls also carry the turn they start (turn, an OamTurn):
##   var turn := await bridge.respond("keeper", "Any ale?").turn.wait()
## No class_name: preload it (const OamCall := preload("res://addons/oam_bridge/oam_call.gd")).

## error: {} on success, else {code, rpc_code, message, retryable, data}.
signal done(result: Variant, error: Dictionary)

const OamCall := preload("oam_call.gd")
const OamTurn := preload("oam_turn.gd")

var method: String
var id: int
var result: Variant = null
var error: Dictionary = {}
var finished := false
## The turn this request starts (respond, decide, prewarm); null for other methods.
var turn: OamTurn


func _init(p_method: String = "", p_id: int = 0) -> void:
	method = p_method
	id = p_id


func is_ok() -> bool:
	return finished and error.is_empty()


## Waits until the call is finished (returns at once if it already is) and returns it.
func wait() -> OamCall:
	if not finished:
		await done
	return self


## Called by the client (oam_bridge.gd); a second call is ignored.
func finish(p_result: Variant, p_error: Dictionary) -> void:
	if finished:
		return
	finished = true
	result = p_result
	error = p_error
	done.emit(result, error)
