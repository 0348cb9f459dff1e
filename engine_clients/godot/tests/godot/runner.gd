extends Node
## Runs the addon in real Godot (headless): the shared scenario (../../../scenario.json, copied
## next to this file by the host test), the README quick start, and the addon's own checks.
## Prints "ok - NAME" / "FAIL - NAME: why", then "godot real: P passed, F failed", and quits
## with 0 only if everything passed. Arguments after "--":
##   --only=a,b   run these tests only      --bridge=CMD   the bridge command (oam-bridge)
##   --skip=a,b   leave these tests out     --dist=PATH    the make dist executable (shipping)
##   --orphan     start a bridge, print "ORPHAN <godot pid> <bridge pid>", then idle
## Untyped where it calls the addon, so an older addon still loads and its checks fail one by one.

const ADDON := "res://addons/oam_bridge/"
const SCENARIO := "res://tests/godot/scenario.json"
const QUICKSTART := "res://tests/godot/quickstart.gd"
const SHIPPING := "res://tests/godot/shipping.gd"
## What a test returns when it passed. A script error aborts the test function, which then
## returns "" (its type's default): that counts as a failure.
const PASS := "pass"

var bridge_command := "oam-bridge"
var dist_executable := ""
var passed := 0
var failed := 0
var current := ""
var frame_gap_ms := 0
var _last_frame := 0


func _ready() -> void:
	var only := PackedStringArray()
	var skip := PackedStringArray()
	var orphan := false
	for arg in OS.get_cmdline_user_args():
		if arg.begins_with("--only="):
			only = arg.trim_prefix("--only=").split(",")
		elif arg.begins_with("--skip="):
			skip = arg.trim_prefix("--skip=").split(",")
		elif arg.begins_with("--dist="):
			dist_executable = arg.trim_prefix("--dist=")
		elif arg.begins_with("--bridge="):
			bridge_command = arg.trim_prefix("--bridge=")
		elif arg == "--orphan":
			orphan = true
	if orphan:
		await _orphan()
		return
	var tests := [
		"scenario",
		"quickstart",
		"shipping",
		"npc_node",
		"integers",
		"missing_command",
		"exits_at_once",
		"stop_nonblocking",
		"big_line",
		"dead_bridge_write",
		"quit_fast",
		"export_placement"
	]
	if "exported" in only:  # only in the exported game (run_real.py exports it first)
		tests.append("exported")
	get_tree().create_timer(240.0).timeout.connect(_watchdog)
	for test_name: String in tests:
		if (not only.is_empty() and test_name not in only) or test_name in skip:
			continue
		current = test_name
		var why: String = await call("_test_" + test_name)
		if why.is_empty():
			why = "script error (see the log)"
		if why == PASS:
			passed += 1
			print("ok - ", test_name)
		else:
			failed += 1
			print("FAIL - %s: %s" % [test_name, why])
	print("godot real: %d passed, %d failed (Godot %s)" % [passed, failed, _version()])
	get_tree().quit(0 if failed == 0 and passed > 0 else 1)


func _process(_delta: float) -> void:
	var now := Time.get_ticks_msec()
	if _last_frame > 0:
		frame_gap_ms = maxi(frame_gap_ms, now - _last_frame)
	_last_frame = now


func _watchdog() -> void:
	print("FAIL - %s: timed out (watchdog)" % current)
	print("godot real: %d passed, %d failed (watchdog)" % [passed, failed + 1])
	get_tree().quit(1)


func _version() -> String:
	return str(Engine.get_version_info()["string"])


func _client() -> Node:
	var client: Node = load(ADDON + "oam_bridge.gd").new()
	client.use_project_settings = false
	client.echo_stderr = false
	add_child(client)
	return client


func _started(args := PackedStringArray(["--engine", "scripted"])) -> Node:
	var client := _client()
	if not client.start(bridge_command, args):
		return null
	var init = await client.initialize("godot-real-test", "1").wait()
	if not init.is_ok():
		return null
	return client


# The bridge's pid (the addon before get_pid() kept it in _pid).
func _pid_of(client: Node) -> int:
	return client.get_pid() if client.has_method("get_pid") else int(client.get("_pid"))


func _done(client: Node) -> void:
	client.stop()
	client.queue_free()


func _frames(count: int) -> void:
	for i in count:
		await get_tree().process_frame


# --- the shared scenario ----------------------------------------------------------------


func _test_scenario() -> String:
	var steps := {}
	var scenario: Dictionary = JSON.parse_string(FileAccess.get_file_as_string(SCENARIO))
	for step: Dictionary in scenario["steps"]:
		steps[step["name"]] = step
	var client := _client()
	var events := {}  # turn id -> [[method, params], ...]
	client.event_received.connect(
		func(method: String, params: Dictionary) -> void:
			var turn_id := str(params.get("turnId"))
			if not events.has(turn_id):
				events[turn_id] = []
			events[turn_id].append([method, params])
	)
	var protocol = load(ADDON + "oam_protocol.gd")
	if not client.start(bridge_command, PackedStringArray(["--engine", "scripted"])):
		return "start failed"
	var p: Dictionary = steps["initialize"]["request"]["params"]
	var call = await client.initialize(p["clientInfo"]["name"], p["clientInfo"]["version"]).wait()
	if not call.is_ok() or int(call.result["protocolVersion"]) != 1:
		return "initialize: %s" % [call.error]
	if typeof(call.result["serverInfo"]["name"]) != TYPE_STRING:
		return "initialize: serverInfo.name"
	# create_keeper, with a tool answered by a handler
	var tool_args := []
	client.register_tool(
		"check_inventory",
		func(arguments: Dictionary) -> Dictionary:
			tool_args.append(arguments)
			return {"count": 3}
	)
	p = steps["create_keeper"]["request"]["params"].duplicate(true)
	call = await client.create_npc(p["npcId"], p).wait()
	if not call.is_ok() or call.result["engine"] != "scripted":
		return "create_keeper: %s" % [call.error]
	# respond_with_tool
	p = steps["respond_with_tool"]["request"]["params"]
	call = client.respond(p["npcId"], p["prompt"])
	var turn = await call.turn.wait()
	if not call.is_ok() or not turn.is_ok():
		return "respond_with_tool: %s %s" % [call.error, turn.error]
	var why := _check_turn(events.get(turn.turn_id, []), "keeper")
	if not why.is_empty():
		return "respond_with_tool: " + why
	var methods := _methods(events[turn.turn_id])
	var deltas := ""
	for event: Array in events[turn.turn_id]:
		if event[0] == "turn/textDelta":
			deltas += str(event[1]["delta"])
	if tool_args != [{"item": "ale"}] or "turn/toolCallCompleted" not in methods:
		return "respond_with_tool: tool %s, events %s" % [tool_args, methods]
	var record: Dictionary = turn.result["toolCalls"][0]
	if turn.text != "We have 3 barrels of ale." or deltas != turn.text:
		return "respond_with_tool: text %s / deltas %s" % [turn.text, deltas]
	# output is the game's own JSON, without a schema: numbers in it stay floats
	if record["name"] != "check_inventory" or int(record["output"]["count"]) != 3:
		return "respond_with_tool: toolCalls %s" % [record]
	# schema_turn
	p = steps["schema_turn"]["request"]["params"]
	turn = await client.respond(p["npcId"], p["prompt"], {"schema": p["schema"]}).turn.wait()
	var json: Variant = turn.result.get("json")
	if not turn.is_ok() or json != {"mood": "happy", "line": "Welcome!"}:
		return "schema_turn: %s %s" % [json, turn.error]
	# cancel_turn: cancel after the first delta
	p = steps["cancel_turn"]["request"]["params"]
	call = client.respond(p["npcId"], p["prompt"])
	await call.turn.text_delta
	var cancelled = await client.cancel("keeper").wait()
	turn = await call.turn.wait()
	if not cancelled.is_ok() or call.turn.turn_id not in cancelled.result["cancelled"]:
		return "cancel_turn: %s" % [cancelled.result]
	if turn.is_ok() or turn.error["code"] != "cancelled":
		return "cancel_turn: %s" % [turn.error]
	if "turn/completed" in _methods(events[turn.turn_id]):
		return "cancel_turn: a turn/completed after the cancel"
	# transcript, restore
	var save = await client.get_transcript("keeper").wait()
	if not save.is_ok():
		return "transcript: %s" % [save.error]
	var restored = await client.restore(save.result, "keeper2").wait()
	if not restored.is_ok() or restored.result["npcId"] != "keeper2":
		return "restore: %s" % [restored.error]
	if typeof(restored.result["turns"]) != TYPE_INT or restored.result["turns"] < 2:
		return (
			"restore: turns %s (type %d)"
			% [restored.result["turns"], typeof(restored.result["turns"])]
		)
	# world_set
	p = steps["world_set"]["request"]["params"]
	call = await client.world_set(p["key"], p["value"], PackedStringArray(p["tags"])).wait()
	if not call.is_ok() or str(call.result["revision"]) != "1":
		return "world_set: %s %s" % [call.result, call.error]
	p = steps["create_guard"]["request"]["params"].duplicate(true)
	call = await client.create_npc(p["npcId"], p).wait()
	if not call.is_ok():
		return "create_guard: %s" % [call.error]
	p = steps["world_set_scoped"]["request"]["params"]
	call = await client.world_set(p["key"], p["value"], PackedStringArray(p["tags"])).wait()
	if not call.is_ok() or str(call.result["revision"]) != "2":
		return "world_set_scoped: %s" % [call.result]
	call = await client.world_get("guard").wait()
	var facts: Array = call.result["facts"] if call.is_ok() else []
	if str(call.result["revision"]) != "2" or facts.size() != 1:
		return "world_get_for_npc: %s" % [call.result]
	var fact: Dictionary = facts[0]
	if (
		[fact["key"], fact["value"], fact["tags"], fact["npcIds"], fact["lore"]]
		!= ["gate", "closed", ["gate"], null, false]
	):
		return "world_get_for_npc: %s" % [fact]
	# decide
	p = steps["decide"]["request"]["params"]
	var decisions := []
	client.decision_made.connect(
		func(npc: String, _t: String, choice: String, _a: Dictionary, reasoning: String) -> void:
			decisions.append([npc, choice, reasoning])
	)
	call = client.decide(p["npcId"], p["situation"], p["options"])
	turn = await call.turn.wait()
	var first: Array = events.get(turn.turn_id, [[""]])[0]
	if not turn.is_ok() or first[0] != "turn/started" or first[1]["kind"] != "decide":
		return "decide: %s %s" % [turn.error, first]
	if turn.result["json"]["choice"] != "question" or str(turn.result["worldRevision"]) != "2":
		return "decide: %s" % [turn.result]
	if decisions != [["guard", "question", "It is late and I do not know them."]]:
		return "decide: decision_made %s" % [decisions]
	# guardrail_fallback
	p = steps["guardrail_fallback"]["request"]["params"]
	turn = await client.respond(p["npcId"], p["prompt"], {"guardrail": p["guardrail"]}).turn.wait()
	if not turn.is_ok() or turn.result["finishReason"] != "fallback":
		return "guardrail_fallback: %s %s" % [turn.result, turn.error]
	if turn.text != "Let's talk about something else.":
		return "guardrail_fallback: text %s" % turn.text
	if not str(turn.result["warnings"][0]).begins_with("guardrail_violation"):
		return "guardrail_fallback: warnings %s" % [turn.result["warnings"]]
	# npc_to_npc
	p = steps["npc_to_npc"]["request"]["params"]
	var speakers := []
	client.turn_started.connect(
		func(_n: String, _t: String, _p: String, speaker: String, _k: String) -> void:
			speakers.append(speaker)
	)
	turn = await client.respond(p["npcId"], p["prompt"], {"speaker": p["speaker"]}).turn.wait()
	if not turn.is_ok() or turn.text != "The storm is coming, friend." or speakers != ["keeper"]:
		return "npc_to_npc: %s %s %s" % [turn.text, speakers, turn.error]
	# prewarm
	turn = await client.prewarm("guard").turn.wait()
	if not turn.is_ok() or turn.result["finishReason"] != "prewarmed" or turn.kind != "prewarm":
		return "prewarm: %s %s" % [turn.result, turn.kind]
	if str(turn.result["steps"]) != "0" or turn.result["text"] != "":
		return "prewarm: %s" % [turn.result]
	# set_tags, world_get_after_tags, world_delete
	call = await client.set_tags("guard", PackedStringArray(["gate", "tavern"])).wait()
	if not call.is_ok() or call.result != {}:
		return "set_tags: %s" % [call.result]
	call = await client.world_get("guard").wait()
	var keys := []
	for each: Dictionary in call.result["facts"]:
		keys.append(each["key"])
	if keys != ["gate", "weather"]:
		return "world_get_after_tags: %s" % [keys]
	call = await client.world_delete("weather").wait()
	if str(call.result["revision"]) != "3" or call.result["deleted"] != true:
		return "world_delete: %s" % [call.result]
	# unknown_npc: a bridge error as the client's error; its turn fails too
	call = client.respond("nobody", "hi")
	await call.wait()
	if call.is_ok() or call.error["rpc_code"] != -31020 or call.error["code"] != "unknown_npc":
		return "unknown_npc: %s" % [call.error]
	if call.turn.is_ok() or call.turn.error["code"] != "unknown_npc":
		return "unknown_npc: the turn %s" % [call.turn.error]
	# shutdown, exit
	call = await client.shutdown().wait()
	if not call.is_ok() or call.result != null:
		return "shutdown: %s" % [call.error]
	var pid: int = _pid_of(client)
	client.notify("exit")
	var deadline := Time.get_ticks_msec() + 3000
	while OS.is_process_running(pid) and Time.get_ticks_msec() < deadline:
		await get_tree().process_frame
	if OS.is_process_running(pid) or OS.get_process_exit_code(pid) != 0:
		return (
			"exit: running %s, exit code %d"
			% [OS.is_process_running(pid), OS.get_process_exit_code(pid)]
		)
	_done(client)
	return PASS


func _methods(list: Array) -> Array:
	var out := []
	for event: Array in list:
		out.append(event[0])
	return out


func _check_turn(list: Array, npc_id: String) -> String:
	for i in list.size():
		var params: Dictionary = list[i][1]
		if params["npcId"] != npc_id or params["seq"] != i:
			return "event %d: %s" % [i, params]
	if list.is_empty() or list[0][0] != "turn/started" or list[-1][0] != "turn/completed":
		return "events %s" % [_methods(list)]
	return ""


# --- the README quick start -------------------------------------------------------------


func _test_quickstart() -> String:
	var bridge := get_node_or_null(^"/root/OamBridge")
	if bridge == null:
		return "no autoload OamBridge"
	if not ResourceLoader.exists(QUICKSTART):
		return "no quickstart.gd (made by the host test from the README)"
	var completed := []
	bridge.turn_completed.connect(
		func(npc: String, _t: String, result: Dictionary) -> void: completed.append([npc, result])
	)
	var node: Node = load(QUICKSTART).new()
	var log_label := RichTextLabel.new()
	log_label.name = "Log"  # the quick start's $Log
	node.add_child(log_label)
	add_child(node)
	var deadline := Time.get_ticks_msec() + 10000
	while completed.is_empty() and Time.get_ticks_msec() < deadline:
		await get_tree().process_frame
	await _frames(5)
	var why := ""
	if completed.is_empty():
		why = "no turn completed (last_error %s)" % bridge.last_error
	elif completed[0][0] != "keeper" or str(completed[0][1].get("text", "")).is_empty():
		why = "completed %s" % [completed]
	elif node.has_method("quickstart_checks"):
		why = node.quickstart_checks()
	node.queue_free()
	bridge.stop()
	return why if not why.is_empty() else PASS


# --- the README's "Shipping your game" --------------------------------------------------


# The README's snippet as printed (shipping.gd, made by the host test), with `make dist`'s
# build where its editor path points: res://../oam-bridge/dist/oam-bridge/ (the host test lays
# the project out so). Its `--engine auto` is kept: a scripted NPC, then one on the default
# engine, which is the dist's bundled model (llama).
func _test_shipping() -> String:
	var bridge := get_node_or_null(^"/root/OamBridge")
	if bridge == null:
		return "no autoload OamBridge"
	if not ResourceLoader.exists(SHIPPING):
		return "no shipping.gd (made by the host test from the README)"
	var deadline := Time.get_ticks_msec() + 3000
	while bridge.is_running() and Time.get_ticks_msec() < deadline:  # the quick start's bridge
		await get_tree().process_frame
	var node: Node = load(SHIPPING).new()
	add_child(node)
	var why := await _shipped_turns(bridge, node)  # "" after a script error: a failure
	bridge.stop()
	node.queue_free()
	return why


func _shipped_turns(bridge: Node, node: Node) -> String:
	var t0 := Time.get_ticks_msec()
	if not node.call("_start_shipped_bridge"):
		return "_start_shipped_bridge() returned false: %s" % bridge.last_error
	var editor_path := "res://../oam-bridge/dist/oam-bridge/oam-bridge"
	var expected := ProjectSettings.globalize_path(editor_path).simplify_path()
	if bridge.command != expected or Array(bridge.arguments) != ["--engine", "auto"]:
		return "started %s %s, not %s --engine auto" % [bridge.command, bridge.arguments, expected]
	var init = await bridge.initialize("godot-shipping-test", "1").wait()
	if not init.is_ok() or init.result["serverInfo"]["name"] != "oam-bridge":
		return "initialize: %s %s" % [init.result, init.error]
	var started_ms := Time.get_ticks_msec() - t0
	# after the answer: right after start() the child may not have exec'd yet (still godot)
	var exe := DirAccess.open("/proc").read_link("/proc/%d/exe" % _pid_of(bridge))
	if not dist_executable.is_empty() and exe != dist_executable:
		return "the bridge process runs %s, not the dist's %s" % [exe, dist_executable]
	var config := {"engine": "scripted", "script": [{"text": "Shipped."}]}
	await bridge.create_npc("porter", config).wait()
	var turn = await bridge.respond("porter", "Is it shipped?").turn.wait()
	if not turn.is_ok() or turn.text != "Shipped.":
		return "scripted turn: %s %s" % [turn.text, turn.error]
	t0 = Time.get_ticks_msec()
	config = {"instructions": "You guard the gate. Answer in one short sentence."}
	var created = await bridge.create_npc("guard", config).wait()
	if not created.is_ok() or created.result["engine"] != "llama":
		return "npc/create on engine auto: %s %s" % [created.result, created.error]
	turn = await bridge.respond("guard", "Who goes there?").turn.wait()
	if not turn.is_ok() or turn.text.strip_edges().is_empty():
		return "the bundled model's turn: '%s' %s" % [turn.text, turn.error]
	var line: String = turn.text.strip_edges().left(60)
	print("  shipped bridge: %s" % exe)
	print(
		(
			"  initialize answered %d ms after start; the model's turn %d ms (with its loading): %s"
			% [started_ms, Time.get_ticks_msec() - t0, line]
		)
	)
	return PASS


# The export plugin's copy (oam_export.gd): the shipped folder lands beside the game's
# executable as oam-bridge/, its executable still executable, where shipped_bridge_path looks.
func _test_export_placement() -> String:
	if not ResourceLoader.exists(ADDON + "oam_export.gd"):
		return "no oam_export.gd (the export plugin's copy)"
	if ResourceLoader.load(ADDON + "oam_export_plugin.gd") == null:
		return "oam_export_plugin.gd does not load"
	var export_script: GDScript = load(ADDON + "oam_export.gd")
	var root := OS.get_user_data_dir().path_join("oam_export_test")
	var dist := root.path_join("dist")
	var game := root.path_join("game")
	DirAccess.make_dir_recursive_absolute(dist.path_join("_internal/lib"))
	var exe := FileAccess.open(dist.path_join("oam-bridge"), FileAccess.WRITE)
	exe.store_string("#!/bin/sh\necho shipped\n")
	exe.close()
	FileAccess.set_unix_permissions(dist.path_join("oam-bridge"), 493)  # 0755
	var lib := FileAccess.open(dist.path_join("_internal/lib/data.bin"), FileAccess.WRITE)
	lib.store_string("data")
	lib.close()
	var missing: String = export_script.place(root.path_join("nothing"), game)
	if not missing.contains("no oam-bridge in"):
		return "a folder without the executable: %s" % missing
	var why: String = export_script.place(dist, game)
	if not why.is_empty():
		return "place: " + why
	var placed := game.path_join("oam-bridge/oam-bridge")
	if FileAccess.get_file_as_string(game.path_join("oam-bridge/_internal/lib/data.bin")) != "data":
		return "the _internal folder was not copied"
	if (FileAccess.get_unix_permissions(placed) & 73) == 0:  # 73 = 0111: no x bit
		return (
			"the copied executable is not executable (mode %d)"
			% FileAccess.get_unix_permissions(placed)
		)
	var out: Array = []
	if OS.execute(placed, [], out) != 0 or not str(out[0]).contains("shipped"):
		return "the copied executable does not run: %s" % out
	return PASS


# In the exported game only: the export plugin put the shipped bridge beside the executable,
# and the client starts it from there (shipped_bridge_path without an editor path).
func _test_exported() -> String:
	if OS.has_feature("editor"):
		return "not an exported game (run_real.py runs this in the exported executable)"
	var bridge := get_node_or_null(^"/root/OamBridge")
	if bridge == null:
		return "no autoload OamBridge"
	var path: String = bridge.shipped_bridge_path()
	var expected := OS.get_executable_path().get_base_dir().path_join("oam-bridge/oam-bridge")
	if path != expected:
		return "shipped_bridge_path() is %s, not %s" % [path, expected]
	if not bridge.start(path, PackedStringArray(["--engine", "scripted"])):
		return "start(%s): %s" % [path, bridge.last_error]
	var init = await bridge.initialize("godot-exported-test", "1").wait()
	if not init.is_ok():
		return "initialize: %s" % init.error
	var config := {"engine": "scripted", "script": [{"text": "Exported."}]}
	await bridge.create_npc("porter", config).wait()
	var turn = await bridge.respond("porter", "Is it shipped?").turn.wait()
	bridge.stop()
	if not turn.is_ok() or turn.text != "Exported.":
		return "scripted turn: %s %s" % [turn.text, turn.error]
	print("  the exported game started %s" % path)
	return PASS


# --- the addon's own checks -------------------------------------------------------------


# One node per NPC, its own signals, turns to await, tools declared once from a callable.
func _test_npc_node() -> String:
	if not ResourceLoader.exists(ADDON + "oam_npc.gd"):
		return "no oam_npc.gd (one node per NPC)"
	var client := await _started()
	if client == null:
		return "start"
	var npc_script: Script = load(ADDON + "oam_npc.gd")
	var keeper: Node = npc_script.new()
	keeper.npc_id = "keeper"
	keeper.bridge = client
	keeper.config = {
		"engine": "scripted",
		"script":
		[
			{"toolCalls": [{"name": "count_item", "arguments": {"item": "ale", "min": 2}}]},
			{"text": "Three barrels."},
			{"json": {"reasoning": "Late.", "choice": "wait", "arguments": {"minutes": 5}}},
		]
	}
	var got := []
	keeper.add_tool(
		func(arguments: Dictionary) -> Dictionary:
			got.append(arguments)
			return {"count": 3},
		"Count an item",
		{"item": {"type": "string"}, "min": {"type": "integer"}},
		"count_item"
	)
	var other: Node = npc_script.new()
	other.npc_id = "other"
	other.bridge = client
	other.config = {"engine": "scripted", "script": [{"text": "Hm."}]}
	add_child(keeper)
	add_child(other)
	var keeper_deltas := []
	var other_deltas := []
	keeper.text_delta.connect(
		func(_t: String, d: String, _x: String, _r: bool) -> void: keeper_deltas.append(d)
	)
	other.text_delta.connect(
		func(_t: String, d: String, _x: String, _r: bool) -> void: other_deltas.append(d)
	)
	var created = await keeper.create().wait()
	var created2 = await other.create().wait()
	if not created.is_ok() or not created2.is_ok():
		return "create: %s %s" % [created.error, created2.error]
	var turn_a = keeper.say("Any ale?")
	var turn_b = other.say("Hello?")
	var b = await turn_b.wait()
	var a = await turn_a.wait()
	if not a.is_ok() or a.text != "Three barrels." or b.text != "Hm.":
		return "turns: %s / %s" % [a.text, b.text]
	if "".join(keeper_deltas) != "Three barrels." or "".join(other_deltas) != "Hm.":
		return "per-NPC signals: %s / %s" % [keeper_deltas, other_deltas]
	if got.size() != 1 or typeof(got[0]["min"]) != TYPE_INT:
		return "tool arguments %s" % [got]
	var decisions := []
	keeper.decision_made.connect(
		func(_t: String, choice: String, arguments: Dictionary, _r: String) -> void:
			decisions.append([choice, arguments])
	)
	var minutes := {"type": "object", "properties": {"minutes": {"type": "integer"}}}
	var options := [
		{"name": "wait", "description": "wait", "parameters": minutes},
		{"name": "go", "description": "go"},
	]
	var decision = await keeper.decide("A knock.", options).wait()
	if not decision.is_ok() or decision.json()["choice"] != "wait" or decisions.size() != 1:
		return "decide: %s %s" % [decision.result, decisions]
	if typeof(decisions[0][1]["minutes"]) != TYPE_INT or str(decisions[0][1]["minutes"]) != "5":
		return "decision arguments %s" % [decisions[0][1]]
	# prewarm: no arguments (the player is next), then who speaks next and how the line starts
	var started := []
	keeper.turn_started.connect(
		func(_t: String, prompt: String, speaker: String, kind: String) -> void:
			started.append([prompt, speaker, kind])
	)
	var warmed = await keeper.prewarm().wait()
	var warmed2 = await keeper.prewarm("other", "So,").wait()
	for each in [warmed, warmed2]:
		if not each.is_ok() or each.result["finishReason"] != "prewarmed":
			return "prewarm: %s %s" % [each.result, each.error]
	if started != [["", "", "prewarm"], ["So,", "other", "prewarm"]]:
		return "prewarm: turn_started %s" % [started]
	_done(client)
	keeper.queue_free()
	other.queue_free()
	return PASS


# Integers come back as integers where protocol.md or the tool's schema says integer.
func _test_integers() -> String:
	var client := await _started()
	if client == null:
		return "start"
	var got := []
	client.register_tool(
		"roll",
		func(arguments: Dictionary) -> Dictionary:
			got.append(arguments)
			return {"rolled": "%s" % arguments.get("sides")}
	)
	var schema := {
		"type": "object", "properties": {"sides": {"type": "integer"}, "bonus": {"type": "number"}}
	}
	var config := {
		"engine": "scripted",
		"tools": [{"name": "roll", "description": "Roll a die", "parameters": schema}],
		"script":
		[
			{"toolCalls": [{"name": "roll", "arguments": {"sides": 6, "bonus": 2}}]},
			{"text": "A six."}
		]
	}
	await client.create_npc("dicer", config).wait()
	var seqs := []
	client.event_received.connect(
		func(_m: String, params: Dictionary) -> void: seqs.append(typeof(params["seq"]))
	)
	var turn = await client.respond("dicer", "Roll!").turn.wait()
	var set_call = await client.world_set("k", "v").wait()
	var why := ""
	if not turn.is_ok():
		why = "turn %s" % [turn.error]
	elif got.is_empty() or "%s" % got[0]["sides"] != "6" or typeof(got[0]["sides"]) != TYPE_INT:
		why = "tool argument sides: %s" % [got]
	elif typeof(got[0]["bonus"]) != TYPE_FLOAT:
		why = "a number stays a float: %s" % [got]
	elif seqs.has(TYPE_FLOAT):
		why = "seq as float"
	elif (
		typeof(turn.result["worldRevision"]) != TYPE_INT or typeof(turn.result["steps"]) != TYPE_INT
	):
		why = "worldRevision/steps %s" % [turn.result]
	elif typeof(turn.result["usage"]["outputTokens"]) != TYPE_INT:
		why = "usage %s" % [turn.result["usage"]]
	elif "%s" % set_call.result["revision"] != "1":
		why = "world/set revision prints as %s" % set_call.result["revision"]
	_done(client)
	return why if not why.is_empty() else PASS


# start() of a command that does not exist: false and a clear error, not a silent true.
func _test_missing_command() -> String:
	var client := _client()
	var started: bool = client.start("/nonexistent/oam-bridge", PackedStringArray())
	var started2: bool = client.start("oam-bridge-not-installed", PackedStringArray())
	var why := ""
	if started or started2:
		why = "start() returned true for a missing command"
	elif str(client.get("last_error")).find("not found") < 0:
		why = "no clear error: %s" % client.get("last_error")
	client.stop()
	client.queue_free()
	return why if not why.is_empty() else PASS


# A command that exists but exits at once: initialize fails at once with the exit code.
func _test_exits_at_once() -> String:
	var client := _client()
	if not client.start("false", PackedStringArray()):
		return "start() of /bin/false: %s" % client.get("last_error")
	var t0 := Time.get_ticks_msec()
	var call = client.initialize()
	var timer := get_tree().create_timer(3.0)
	while not call.finished and timer.time_left > 0:
		await get_tree().process_frame
	var why := ""
	if not call.finished:
		why = "initialize still waiting after 3 s"
	elif (
		call.error.get("code") != "bridge_closed"
		or str(call.error["message"]).find("exit code 1") < 0
	):
		why = "error %s" % [call.error]
	elif Time.get_ticks_msec() - t0 > 1000:
		why = "took %d ms" % (Time.get_ticks_msec() - t0)
	client.stop()
	client.queue_free()
	return why if not why.is_empty() else PASS


# stop() returns at once; the bridge is gone soon after, watched from the frames.
func _test_stop_nonblocking() -> String:
	var client := await _started()
	if client == null:
		return "start"
	await (
		client
		. create_npc(
			"slow", {"engine": "scripted", "script": [{"text": "a b c d e f g h", "chunkMs": 200}]}
		)
		. wait()
	)
	client.respond("slow", "talk")
	await _frames(2)
	var pid: int = _pid_of(client)
	var t0 := Time.get_ticks_usec()
	client.stop()
	var blocked_ms := (Time.get_ticks_usec() - t0) / 1000.0
	var deadline := Time.get_ticks_msec() + 3000
	while OS.is_process_running(pid) and Time.get_ticks_msec() < deadline:
		await get_tree().process_frame
	await _frames(3)
	var why := ""
	if blocked_ms > 5.0:
		why = "stop() blocked the main thread %.1f ms" % blocked_ms
	elif OS.is_process_running(pid):
		why = "bridge still running 3 s after stop()"
	elif client.is_running():
		why = "is_running() after stop()"
	client.queue_free()
	print("  stop(): %.2f ms on the main thread" % blocked_ms)
	return why if not why.is_empty() else PASS


# A 3 MB line arrives in blocks off the main thread: quickly, and without a long frame.
func _test_big_line() -> String:
	var client := await _started()
	if client == null:
		return "start"
	var big := "x".repeat(3 * 1024 * 1024)
	await client.create_npc("big", {"engine": "scripted", "instructions": big}).wait()
	await _frames(3)
	frame_gap_ms = 0
	_last_frame = 0
	var t0 := Time.get_ticks_msec()
	var call = await client.get_transcript("big").wait()
	var took := Time.get_ticks_msec() - t0
	await _frames(3)
	var gap := frame_gap_ms
	var why := ""
	if not call.is_ok() or str(call.result["config"]["instructions"]).length() != big.length():
		why = "transcript %s" % [call.error]
	elif took > 1500:
		why = "a 3 MiB line took %d ms to arrive" % took
	elif gap > 60:
		why = "a %d ms frame while it arrived" % gap
	print("  3 MiB line: %d ms to arrive, longest frame %d ms" % [took, gap])
	_done(client)
	return why if not why.is_empty() else PASS


# After the bridge died, nothing more is written to it (SIGPIPE on Godot 4.3.0-4.5.1).
func _test_dead_bridge_write() -> String:
	var client := await _started()
	if client == null:
		return "start"
	var pid: int = _pid_of(client)
	OS.kill(pid)
	var deadline := Time.get_ticks_msec() + 2000
	while OS.is_process_running(pid) and Time.get_ticks_msec() < deadline:
		OS.delay_msec(1)  # no frame passes: the reader thread's notice is still queued
	var why := ""
	if client.is_running():
		why = "is_running() true for a dead bridge (the next request would write to it)"
	var written: Variant = client.get("lines_written")
	var call = client.list_npcs()
	if why.is_empty() and (written == null or client.get("lines_written") != written):
		why = "a line was written to the dead bridge"
	await call.wait()
	if why.is_empty() and call.error.get("code") != "bridge_closed":
		why = "error %s" % [call.error]
	client.stop()
	client.queue_free()
	return why if not why.is_empty() else PASS


# Quitting with a bridge that does not exit by itself (here `sleep`, which never reads the
# exit notification): leaving the tree must not wait shutdown_timeout_ms for it.
func _test_quit_fast() -> String:
	var client := _client()
	if not client.start("sleep", PackedStringArray(["30"])):
		return "start sleep"
	var pid: int = _pid_of(client)
	await get_tree().process_frame  # out of the client's own call stack
	var t0 := Time.get_ticks_usec()
	remove_child(client)  # _exit_tree: as when the game quits
	client.free()
	var ms := (Time.get_ticks_usec() - t0) / 1000.0
	var deadline := Time.get_ticks_msec() + 2000
	while OS.is_process_running(pid) and Time.get_ticks_msec() < deadline:
		await get_tree().process_frame
	print("  leaving the tree: %.2f ms" % ms)
	if ms > 150.0:
		return "leaving the tree blocked %.1f ms" % ms
	if OS.is_process_running(pid):
		return "bridge still running"
	return PASS


# --- orphan: the host kills this Godot with SIGKILL and checks the bridge goes too ------


func _orphan() -> void:
	var client := await _started()
	if client == null:
		print("ORPHAN-FAIL start")
		get_tree().quit(1)
		return
	print("ORPHAN %d %d" % [OS.get_process_id(), _pid_of(client)])
