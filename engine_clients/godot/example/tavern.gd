extends Control
## Tavern example: Greta the keeper answers from a check_inventory tool; her words stream
## into a RichTextLabel as they arrive. Type into the LineEdit and press Enter.
## She carries the tag "tavern", so she knows the world fact scoped to it (the weather); she
## is prewarmed while the scene opens, and a line her guardrails block gets a fallback line.

const OamBridgeClient := preload("res://addons/oam_bridge/oam_bridge.gd")
const OamProtocol := preload("res://addons/oam_bridge/oam_protocol.gd")
const NPC_ID := "keeper"

## Bridge executable; "" means the shipped bridge next to the game's executable in an export,
## and <repo>/.venv/bin/oam-bridge in the editor (this project lives in engine_clients/godot
## of the oam-bridge repo).
@export var bridge_command: String = ""
@export var bridge_arguments: PackedStringArray = PackedStringArray(["--engine", "scripted"])
## npc/create's engine: "scripted" plays a fixed script (below); "auto" lets the bridge pick.
@export var npc_engine: String = "scripted"

var stock := {"ale": 3, "bread": 12, "stew": 0}
var bridge: OamBridgeClient

@onready var log_label: RichTextLabel = $VBox/Log
@onready var input: LineEdit = $VBox/Input


func _ready() -> void:
	bridge = get_node_or_null(^"/root/OamBridge") as OamBridgeClient
	if bridge == null:  # plugin not enabled: run a private client
		bridge = OamBridgeClient.new()
		bridge.use_project_settings = false
		add_child(bridge)
	bridge.turn_started.connect(_on_turn_started)
	bridge.text_delta.connect(_on_text_delta)
	bridge.tool_call_requested.connect(_on_tool_call_requested)
	bridge.turn_completed.connect(_on_turn_completed)
	bridge.turn_failed.connect(_on_turn_failed)
	input.text_submitted.connect(_on_input_submitted)
	input.editable = false

	var command := bridge_command
	if command.is_empty():
		command = OamBridgeClient.shipped_bridge_path("res://../../.venv/bin/oam-bridge")
	if not bridge.start(command, bridge_arguments):
		_say("[color=red]could not start %s[/color]" % command)
		return
	var init := await bridge.initialize("tavern-example", "1").wait()
	if not init.is_ok():
		_say("[color=red]initialize: %s[/color]" % init.error["message"])
		return
	var created := await bridge.create_npc(NPC_ID, _keeper_config()).wait()
	if not created.is_ok():
		_say("[color=red]npc/create: %s[/color]" % created.error["message"])
		return
	# A world fact for the NPCs tagged "tavern"; it is in Greta's prompt from her next step.
	var tavern_only := PackedStringArray(["tavern"])
	await bridge.world_set("weather", "rain drums on the roof", tavern_only).wait()
	bridge.prewarm(NPC_ID)  # a turn of its own (kind "prewarm"): her first words come sooner
	_say("[i]Greta (engine %s) looks up from the bar.[/i]" % created.result["engine"])
	input.editable = true
	input.grab_focus()


func _keeper_config() -> Dictionary:
	var item_schema := {
		"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]
	}
	# Declared once: the handler is registered and its definition goes to npc/create.
	var inventory_tool := bridge.tool(
		_check_inventory, "How many of an item the tavern has", item_schema
	)
	var config := {
		"persona":
		{
			"name": "Greta",
			"role": "tavern keeper",
			"traits": ["gruff", "kind"],
			"speechStyle": "short sentences",
		},
		"tools": [inventory_tool],
		"engine": npc_engine,
		"tags": ["tavern"],
		"fallbacks": OamProtocol.fallbacks(PackedStringArray(["Hmph. Drink your ale."])),
	}
	if npc_engine == "scripted":  # the scripted engine plays these steps, then echoes
		config["script"] = [
			{"toolCalls": [{"name": "check_inventory", "arguments": {"item": "ale"}}]},
			{"text": "Ale? Aye, we have some. Sit down."},
		]
	return config


# Tool handler: what it returns is submitted as the call's output.
func _check_inventory(arguments: Dictionary) -> Variant:
	var item := str(arguments.get("item", ""))
	if not stock.has(item):
		return OamBridgeClient.tool_error("we never sell %s" % item)
	return {"item": item, "count": stock[item]}


func _on_input_submitted(line: String) -> void:
	if line.strip_edges().is_empty():
		return
	input.clear()
	_say("[b]You:[/b] %s" % line)
	var options := {"guardrail": OamProtocol.GUARDRAIL_FALLBACK}
	var reply := await bridge.respond(NPC_ID, line, options).wait()
	if not reply.is_ok():
		_say("[color=red]%s: %s[/color]" % [reply.error["code"], reply.error["message"]])


func _on_turn_started(
	_npc_id: String, _turn_id: String, _prompt: String, _speaker: String, kind: String
) -> void:
	if kind == OamProtocol.KIND_RESPOND:  # not the prewarm
		log_label.append_text("[b]Greta:[/b] ")


func _on_text_delta(
	_npc_id: String, _turn_id: String, delta: String, _text: String, is_reset: bool
) -> void:
	if is_reset:  # a new step after a tool round: start a fresh line
		log_label.append_text("\n[b]Greta:[/b] ")
	log_label.append_text(_escape(delta))


func _on_tool_call_requested(
	_npc_id: String, _turn_id: String, _call_id: String, tool_name: String, arguments: Dictionary
) -> void:
	log_label.append_text("[i](checks the %s: %s)[/i] " % [tool_name, JSON.stringify(arguments)])


func _on_turn_completed(_npc_id: String, _turn_id: String, result: Dictionary) -> void:
	if result.get("finishReason") != "prewarmed":
		log_label.append_text("\n")


func _on_turn_failed(_npc_id: String, _turn_id: String, error: Dictionary) -> void:
	_say("\n[color=red]turn failed: %s (%s)[/color]" % [error["message"], error["code"]])


func _say(bbcode: String) -> void:
	log_label.append_text(bbcode + "\n")


func _escape(text: String) -> String:
	return text.replace("[", "[lb]")
