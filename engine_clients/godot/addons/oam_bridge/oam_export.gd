extends RefCounted
## Puts the shipped bridge (make dist's folder: the oam-bridge executable beside _internal/)
## next to an exported game's executable, where OamBridge.shipped_bridge_path() finds it.
## Used by the editor's export plugin (oam_export_plugin.gd); plain code, so a running game
## (the real-Godot tests) can check the copy too.

## Project setting: the folder `make dist` built (res:// or absolute).
const SETTING_FOLDER := "oam_bridge/export/bridge_folder"
## The default: a checkout of oam-bridge beside the project, built with make dist (the layout
## of the README's "Shipping your game").
const DEFAULT_FOLDER := "res://../oam-bridge/dist/oam-bridge"
## The folder's name beside the game executable (shipped_bridge_path's layout).
const TARGET_NAME := "oam-bridge"


## The bridge folder the project names, made absolute ("" when the setting is empty).
static func source_folder() -> String:
	var folder: String = ProjectSettings.get_setting(SETTING_FOLDER, DEFAULT_FOLDER)
	if folder.is_empty():
		return ""
	return ProjectSettings.globalize_path(folder).simplify_path()


## Copies the folder `from` to `<game_dir>/oam-bridge`, files and subfolders, keeping each
## file's Unix permissions (the executable stays executable). Returns "" or what went wrong.
static func place(from: String, game_dir: String) -> String:
	var exe_name := "oam-bridge.exe" if OS.get_name() == "Windows" else "oam-bridge"
	if not FileAccess.file_exists(from.path_join(exe_name)):
		return "no %s in %s: run make dist, or set %s" % [exe_name, from, SETTING_FOLDER]
	return _copy_tree(from, game_dir.path_join(TARGET_NAME))


static func _copy_tree(from: String, to: String) -> String:
	var err := DirAccess.make_dir_recursive_absolute(to)
	if err != OK:
		return "cannot make %s: %s" % [to, error_string(err)]
	var dir := DirAccess.open(from)
	if dir == null:
		return "cannot read %s: %s" % [from, error_string(DirAccess.get_open_error())]
	dir.include_hidden = true
	for sub in dir.get_directories():
		var why := _copy_tree(from.path_join(sub), to.path_join(sub))
		if not why.is_empty():
			return why
	for file in dir.get_files():
		var source := from.path_join(file)
		err = DirAccess.copy_absolute(source, to.path_join(file))
		if err != OK:
			return "cannot copy %s: %s" % [source, error_string(err)]
		var mode := FileAccess.get_unix_permissions(source)
		if mode != 0:
			FileAccess.set_unix_permissions(to.path_join(file), mode)
	return ""
