@tool
extends EditorExportPlugin
## On export to a desktop platform, copies the shipped bridge (the project setting
## oam_bridge/export/bridge_folder, make dist's dist/oam-bridge) next to the exported
## executable, as oam-bridge/: no manual copy after export. Registered by plugin.gd.

const OamExport := preload("oam_export.gd")

var _game_dir := ""
var _desktop := false


func _get_name() -> String:
	return "OamBridge"


func _export_begin(features: PackedStringArray, _is_debug: bool, path: String, _flags: int) -> void:
	_game_dir = path.get_base_dir()
	# consoles, mobile and the web cannot start a subprocess: nothing to ship there
	_desktop = (
		(features.has("linux") or features.has("windows") or features.has("macos"))
		and not features.has("web")
	)


func _export_end() -> void:
	if not _desktop or _game_dir.is_empty():
		return
	var source := OamExport.source_folder()
	if source.is_empty():
		return
	var why := OamExport.place(source, _game_dir)
	if why.is_empty():
		print("[oam-bridge] copied %s to %s/oam-bridge" % [source, _game_dir])
	else:
		push_error("[oam-bridge] export: the bridge was not copied: " + why)
