@tool
extends EditorPlugin
## Registers the autoload "OamBridge" (oam_bridge.gd) and its project settings, the OamNpc
## node type (in the Add Node dialog) and the export plugin that ships the bridge beside the
## exported game (oam_export_plugin.gd).

const AUTOLOAD_NAME := "OamBridge"
const OamBridgeClient := preload("oam_bridge.gd")
const OamExport := preload("oam_export.gd")
const ExportPlugin := preload("oam_export_plugin.gd")

var _export_plugin: EditorExportPlugin


func _enable_plugin() -> void:
	var here: String = (get_script() as Script).resource_path.get_base_dir()
	add_autoload_singleton(AUTOLOAD_NAME, here.path_join("oam_bridge.gd"))


func _disable_plugin() -> void:
	remove_autoload_singleton(AUTOLOAD_NAME)


func _enter_tree() -> void:
	var icon := EditorInterface.get_editor_theme().get_icon("Node", "EditorIcons")
	add_custom_type("OamNpc", "Node", preload("oam_npc.gd"), icon)
	_export_plugin = ExportPlugin.new()
	add_export_plugin(_export_plugin)
	_add_setting(OamExport.SETTING_FOLDER, OamExport.DEFAULT_FOLDER, TYPE_STRING)
	_add_setting(OamBridgeClient.SETTING_COMMAND, OamBridgeClient.DEFAULT_COMMAND, TYPE_STRING)
	_add_setting(OamBridgeClient.SETTING_ARGUMENTS, PackedStringArray(), TYPE_PACKED_STRING_ARRAY)
	_add_setting(OamBridgeClient.SETTING_AUTOSTART, false, TYPE_BOOL)
	_add_setting(
		OamBridgeClient.SETTING_SHUTDOWN_TIMEOUT_MS,
		OamBridgeClient.DEFAULT_SHUTDOWN_TIMEOUT_MS,
		TYPE_INT
	)


func _exit_tree() -> void:
	remove_custom_type("OamNpc")
	if _export_plugin != null:
		remove_export_plugin(_export_plugin)
		_export_plugin = null


func _add_setting(setting: String, default_value: Variant, type: int) -> void:
	if not ProjectSettings.has_setting(setting):
		ProjectSettings.set_setting(setting, default_value)
	ProjectSettings.set_initial_value(setting, default_value)
	ProjectSettings.add_property_info({"name": setting, "type": type})
	ProjectSettings.set_as_basic(setting, true)
