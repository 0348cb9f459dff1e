#!/usr/bin/env bash
# Static checks of the Godot 4 client with gdtoolkit 4.x (no Godot binary needed):
# gdparse (syntax), gdlint (./gdlintrc) and gdformat --check over every .gd file in
# addons/ and example/, plus a look at the scene and config files' headers.
# Tools come from ${GDTOOLKIT_BIN:-<repo>/.venv/bin}, else from PATH. Exit 0 = all clean.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${GDTOOLKIT_BIN:-$ROOT/.venv/bin}

find_tool() { # prints the path of gdtoolkit's $1
    if [ -x "$BIN/$1" ]; then echo "$BIN/$1"
    elif command -v "$1"; then :
    else echo "check.sh: $1 not found in $BIN or PATH (pip install 'gdtoolkit>=4,<5')" >&2; return 1; fi
}
GDPARSE=$(find_tool gdparse) && GDLINT=$(find_tool gdlint) && GDFORMAT=$(find_tool gdformat) || exit 2

cd "$HERE"  # gdlint reads ./gdlintrc
mapfile -t FILES < <(find addons example -name '*.gd' | sort)
if [ ${#FILES[@]} -eq 0 ]; then echo "check.sh: no .gd files found" >&2; exit 1; fi
echo "gdtoolkit: $("$GDLINT" --version 2>&1 | head -1) ($GDLINT); ${#FILES[@]} files"

STATUS=0
step() { # step NAME CMD...
    local name=$1; shift
    if "$@"; then echo "ok   - $name"; else echo "FAIL - $name"; STATUS=1; fi
}
step "gdparse" "$GDPARSE" "${FILES[@]}"
step "gdlint" "$GDLINT" "${FILES[@]}"
step "gdformat --check" "$GDFORMAT" --check "${FILES[@]}"

# The README's GDScript (the quick start and the game-layer examples, as one script) must
# at least parse.
QUICK=$(mktemp "${TMPDIR:-/tmp}/oam_quickstart.XXXXXX")
trap 'rm -f "$QUICK"' EXIT
{ echo "extends Node"; echo; awk '/^```gdscript$/{on=1; next} /^```$/{on=0} on' README.md; } >"$QUICK"
step "README GDScript parses" "$GDPARSE" "$QUICK"

# Not parsed by gdtoolkit: only the header lines Godot 4 requires.
header() { # header FILE EXPECTED_REGEX
    grep -Eq "$2" "$1" || { echo "$1: no line matching /$2/" >&2; return 1; }
}
step "tavern.tscn is a format=3 scene" header example/tavern.tscn '^\[gd_scene( [a-z_]+=[^ ]+)* format=3( |\])'
step "plugin.cfg names plugin.gd" header addons/oam_bridge/plugin.cfg '^script="plugin.gd"$'
step "project.godot is config_version=5" header project.godot '^config_version=5$'

[ $STATUS -eq 0 ] && echo "godot static check: PASS" || echo "godot static check: FAIL"
exit $STATUS
