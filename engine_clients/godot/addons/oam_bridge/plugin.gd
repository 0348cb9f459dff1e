@tool
extends EditorPlugin
## Registers the autoload "OamBridge" (oam_bridge.gd) and its project settings.

const AUTOLOAD_NAME := "OamBridge"
const OamBridgeClient := preload("oam_bridge.gd")


func _enable_plugin() -> void:
	var here: String = (get_script() as Script).resource_path.get_base_dir()
	add_autoload_singleton(AUTOLOAD_NAME, here.path_join("oam_bridge.gd"))


func _disable_plugin() -> void:
	remove_autoload_singleton(AUTOLOAD_NAME)


func _enter_tree() -> void:
	_add_setting(OamBridgeClient.SETTING_COMMAND, OamBridgeClient.DEFAULT_COMMAND, TYPE_STRING)
	_add_setting(OamBridgeClient.SETTING_ARGUMENTS, PackedStringArray(), TYPE_PACKED_STRING_ARRAY)
	_add_setting(OamBridgeClient.SETTING_AUTOSTART, false, TYPE_BOOL)
	_add_setting(
		OamBridgeClient.SETTING_SHUTDOWN_TIMEOUT_MS,
		OamBridgeClient.DEFAULT_SHUTDOWN_TIMEOUT_MS,
		TYPE_INT
	)


func _add_setting(setting: String, default_value: Variant, type: int) -> void:
	if not ProjectSettings.has_setting(setting):
		ProjectSettings.set_setting(setting, default_value)
	ProjectSettings.set_initial_value(setting, default_value)
	ProjectSettings.add_property_info({"name": setting, "type": type})
	ProjectSettings.set_as_basic(setting, true)
