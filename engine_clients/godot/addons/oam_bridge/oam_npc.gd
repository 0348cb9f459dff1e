extends Node
## One NPC as a node, with its own signals and turns to await (the shape of NobodyWho's
## chat node): add it to the scene, declare its tools once from their handlers, create() it,
## then say() returns the turn.
##   const OamNpc := preload("res://addons/oam_bridge/oam_npc.gd")
##   var keeper := OamNpc.new()
##   keeper.npc_id = "keeper"
##   keeper.config = {"instructions": "You run the tavern."}
##   keeper.add_tool(_check_inventory, "Count an item", {"item": {"type": "string"}})
##   add_child(keeper)
##   await keeper.create().wait()
##   var turn := await keeper.say("Any ale left?").wait()
## It talks through the autoload OamBridge unless bridge is set. No class_name: preload it.

## The client's signals for this NPC only, without the npc_id argument.
signal turn_started(turn_id: String, prompt: String, speaker: String, kind: String)
signal text_delta(turn_id: String, delta: String, text: String, is_reset: bool)
signal partial_json(turn_id: String, delta: String, json_text: String)
signal tool_call_requested(turn_id: String, call_id: String, name: String, arguments: Dictionary)
signal tool_call_completed(
	turn_id: String, call_id: String, name: String, output: Variant, error: String
)
signal tool_call_withdrawn(turn_id: String, call_id: String, name: String, reason: String)
signal context_trimmed(turn_id: String, info: Dictionary)
signal turn_completed(turn_id: String, result: Dictionary)
signal turn_failed(turn_id: String, error: Dictionary)
signal decision_made(turn_id: String, choice: String, arguments: Dictionary, reasoning: String)

## The NPC's id at the bridge ("" means the node's name).
const OamProtocol := preload("oam_protocol.gd")
const OamCall := preload("oam_call.gd")
const OamTurn := preload("oam_turn.gd")

## Said when there is neither an autoload OamBridge nor a bridge set.
const NO_CLIENT := (
	"OamNpc %s: no autoload OamBridge: enable the OAM Bridge plugin (Project > Project Settings"
	+ " > Plugins), or set this node's bridge to an oam_bridge.gd node before adding it"
)

@export var npc_id: String = ""
## npc/create's params but tools and npcId: instructions, persona, engine, tags, fallbacks,
## script, ...
@export var config: Dictionary = {}

## The client (oam_bridge.gd) this NPC talks through; null means the autoload OamBridge.
var bridge: Node

var _tools: Array[Dictionary] = []
var _handlers := {}  # tool name -> Callable


func _enter_tree() -> void:
	if npc_id.is_empty():
		npc_id = str(name)
	if _client() == null:
		push_error(NO_CLIENT % npc_id)
		return
	_client().attach_npc(npc_id, self)
	for tool_name: String in _handlers:
		_client().register_tool(tool_name, _handlers[tool_name], npc_id)


func _exit_tree() -> void:
	var client := _client()
	if client != null:
		client.detach_npc(npc_id, self)


## Declares a tool once, from its handler (see the client's register_tool for what the
## handler gets and returns). The name is the handler's method name unless given.
func add_tool(
	handler: Callable, description: String, parameters: Dictionary = {}, tool_name: String = ""
) -> void:
	var spec := OamProtocol.tool_from_callable(handler, description, parameters, tool_name)
	_tools.append(spec)
	_handlers[spec["name"]] = handler
	if is_inside_tree():
		_client().register_tool(spec["name"], handler, npc_id)


## npc/create with config and the declared tools.
func create() -> OamCall:
	var params := config.duplicate(true)
	if not _tools.is_empty():
		var tools: Array = params.get("tools", [])
		tools.append_array(_tools)
		params["tools"] = tools
	return _client().create_npc(npc_id, params)


## A turn: the player (or speaker in options) says prompt. Await turn.wait() for its end.
func say(prompt: String, options: Dictionary = {}) -> OamTurn:
	return _client().respond(npc_id, prompt, options).turn


## A decision turn; its json is {reasoning, choice, arguments}; decision_made follows.
func decide(situation: String, options: Array, reasoning := true, remember := false) -> OamTurn:
	return _client().decide(npc_id, situation, options, reasoning, remember).turn


## Gets the NPC ready before it is spoken to (kind "prewarm", finishReason "prewarmed").
## speaker: who speaks next (another NPC's id or a name; "": the player); prompt_prefix: how
## that line starts, when the game knows.
func prewarm(speaker: String = "", prompt_prefix: String = "") -> OamTurn:
	return _client().prewarm(npc_id, speaker, prompt_prefix).turn


func cancel() -> OamCall:
	return _client().cancel(npc_id)


func set_tags(tags: PackedStringArray) -> OamCall:
	return _client().set_tags(npc_id, tags)


func get_transcript() -> OamCall:
	return _client().get_transcript(npc_id)


func restore(save: Dictionary) -> OamCall:
	return _client().restore(save, npc_id)


func reset() -> OamCall:
	return _client().reset(npc_id)


func delete() -> OamCall:
	return _client().delete_npc(npc_id)


func _client() -> Node:
	if bridge == null:
		bridge = get_node_or_null(^"/root/OamBridge")
	return bridge


# Called by the client for each event of this NPC (args: the client signal's arguments).
func _on_bridge_event(method: String, _params: Dictionary, args: Array) -> void:
	var signal_name: String = OamProtocol.EVENT_SIGNALS.get(method, "")
	if signal_name.is_empty():
		return
	callv("emit_signal", [signal_name] + args.slice(1))


func _on_decision(args: Array) -> void:
	callv("emit_signal", ["decision_made"] + args.slice(1))
