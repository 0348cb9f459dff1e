#!/usr/bin/env bash
# Copies the self-contained bridge (`make dist`'s PyInstaller folder) into this plugin, where
# OamBridge.Build.cs stages it with RuntimeDependencies and UOamBridgeSubsystem finds it:
#   <Plugin>/Binaries/ThirdParty/OamBridge/<Platform>/oam-bridge[.exe] (+ _internal/)
# usage: stage_bridge.sh [DIST_FOLDER] [PLATFORM]
#   DIST_FOLDER: default <repo>/dist/oam-bridge; PLATFORM: Win64, Mac, Linux (default: this machine's; the plugin allows these three)
#   OAM_PLUGIN_DIR: the plugin to stage into (default: this folder); OAM_STAGE_LINK=1 hard-links instead of copying.
set -eu
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIST=${1:-$HERE/../../dist/oam-bridge}
case "${2:-$(uname -s)-$(uname -m)}" in
    Win64|MINGW*|MSYS*|CYGWIN*) PLATFORM=Win64; EXE=oam-bridge.exe ;;
    Mac|Darwin-*) PLATFORM=Mac; EXE=oam-bridge ;;
    LinuxArm64|Linux-aarch64|Linux-arm64) echo "stage_bridge.sh: LinuxArm64 is not a platform of the plugin (OamBridge.uplugin: Win64, Linux, Mac)" >&2; exit 2 ;;
    Linux|Linux-*) PLATFORM=Linux; EXE=oam-bridge ;;
    *) echo "stage_bridge.sh: unknown platform ${2:-$(uname -s)}" >&2; exit 2 ;;
esac
[ -f "$DIST/$EXE" ] || { echo "stage_bridge.sh: no $DIST/$EXE (run make dist on a $PLATFORM machine first)" >&2; exit 1; }
DEST=${OAM_PLUGIN_DIR:-$HERE}/Binaries/ThirdParty/OamBridge/$PLATFORM
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
if [ "${OAM_STAGE_LINK:-0}" = 1 ]; then cp -al "$DIST" "$DEST" 2>/dev/null || cp -a "$DIST" "$DEST"; else cp -a "$DIST" "$DEST"; fi
chmod +x "$DEST/$EXE"
echo "staged $(du -sh "$DEST" | cut -f1) into $DEST"
