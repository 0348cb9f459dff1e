#!/usr/bin/env bash
# Runs every available engine-client test against the real bridge.
# A missing toolchain is a SKIP, except with CI=true where it is a FAIL.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATUS=0
skip() { # skip NAME REASON
    if [ "${CI:-}" = true ]; then echo "FAIL $1: $2 (CI=true: toolchain required)"; STATUS=1
    else echo "SKIP $1: $2"; fi
}
run() { # run NAME CMD [ARGS...]
    local name=$1; shift
    echo "== $name"
    if "$@"; then echo "PASS $name"; else echo "FAIL $name"; STATUS=1; fi
}
absent() { skip "$1" "client missing from engine_clients/$1"; }

# shell client: bash + jq
if ! command -v jq >/dev/null; then skip shell "jq not found (apt-get install -y jq)"
else run shell "$HERE/shell/test.sh"; fi

# unreal core: g++ (C++17) + nlohmann/json headers
if [ ! -x "$HERE/unreal/run_tests.sh" ]; then absent unreal
elif ! command -v g++ >/dev/null; then skip unreal "g++ not found (apt-get install -y g++)"
elif ! echo '#include <nlohmann/json.hpp>' | g++ -std=c++17 -x c++ -fsyntax-only - 2>/dev/null; then
    skip unreal "nlohmann/json headers not found (apt-get install -y nlohmann-json3-dev)"
else run unreal "$HERE/unreal/run_tests.sh"; fi

# unity core: mono-mcs + libnewtonsoft-json-cil-dev
if [ ! -x "$HERE/unity/run_tests.sh" ]; then absent unity
elif ! command -v mcs >/dev/null || ! command -v mono >/dev/null; then skip unity "mcs/mono not found (apt-get install -y mono-mcs)"
elif ! ls /usr/lib/cli/Newtonsoft.Json*/Newtonsoft.Json.dll >/dev/null 2>&1; then
    skip unity "Newtonsoft.Json not found (apt-get install -y libnewtonsoft-json-cil-dev)"
else run unity "$HERE/unity/run_tests.sh"; fi

# godot: static check (gdtoolkit) + protocol replay against the real bridge
if [ -d "$HERE/godot/addons/oam_bridge" ]; then
    GDBIN=${GDTOOLKIT_BIN:-$HERE/../.venv/bin}
    if [ -x "$GDBIN/gdparse" ] || command -v gdparse >/dev/null; then run godot-static "$HERE/godot/check.sh"
    else skip godot-static "gdtoolkit not installed (pip install 'gdtoolkit>=4,<5')"; fi
    run godot-replay "$HERE/../.venv/bin/python" "$HERE/godot/tests/replay_test.py"
    # the addon in real Godot 4 (a cached Debian sid chroot; needs root; minutes the first time)
    echo "== godot-real"
    "$HERE/../.venv/bin/python" "$HERE/godot/real/run_real.py"; rc=$?
    if [ $rc -eq 0 ]; then echo "PASS godot-real"
    elif [ $rc -eq 77 ]; then skip godot-real "real Godot could not be set up (godot/real/setup_chroot.sh: root, debootstrap, a Debian mirror)"
    else echo "FAIL godot-real"; STATUS=1; fi
else absent godot; fi

exit $STATUS
