#!/usr/bin/env bash
# Builds the engine-agnostic C++ core and its tests with g++ and runs them against the real
# bridge: framer unit test, scenario.json (tests/scenario_test.cpp), the README quick start and
# game-layer example (its two ```cpp blocks, extracted, so they work as printed). Optional:
# OAM_SANITIZE=1 runs the tests again under AddressSanitizer + UBSan, OAM_TSAN=1 under
# ThreadSanitizer (each adds ~50 s of cold build). Objects in .build/ are reused when newer than their sources.
# Bridge command: $OAM_BRIDGE_CMD, default "$ROOT/.venv/bin/python -m bridge --engine scripted",
# run from the repo root.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD="$HERE/.build"
CORE="$HERE/Source/OamBridge/Core"
CXX=${CXX:-g++}
CXXFLAGS=(-std=c++17 -O1 -Wall -Wextra -Werror -pthread -I"$CORE")
OVERRIDDEN=${OAM_BRIDGE_CMD+yes}
: "${OAM_BRIDGE_CMD:=$ROOT/.venv/bin/python -m bridge --engine scripted}"
export OAM_BRIDGE_CMD
mkdir -p "$BUILD"
FAIL=0

newer_header() { local h; for h in "$CORE"/*.h; do [ "$h" -nt "$1" ] && return 0; done; return 1; }

# build VARIANT EXTRA_FLAGS... -> $BUILD/VARIANT/{framer_test,scenario_test,quickstart,gamelayer}
build() {
    local variant=$1; shift
    local out="$BUILD/$variant" pids=() src obj rc=0
    mkdir -p "$out"
    for src in "$CORE"/oam_line_framer.cpp "$CORE"/oam_process.cpp "$CORE"/oam_client.cpp \
               "$HERE"/tests/framer_test.cpp "$HERE"/tests/scenario_test.cpp "$BUILD"/quickstart.cpp \
               "$BUILD"/gamelayer.cpp "$HERE"/tests/orphan_test.cpp; do
        obj="$out/$(basename "${src%.cpp}").o"
        if [ "$obj" -nt "$src" ] && [ "$obj" -nt "$HERE/run_tests.sh" ] && ! newer_header "$obj"; then continue; fi
        "$CXX" "${CXXFLAGS[@]}" "$@" -c "$src" -o "$obj" & pids+=($!)
    done
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || rc=1; done
    [ $rc -eq 0 ] || return 1
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/framer_test.o "$out"/oam_line_framer.o "$out"/oam_process.o -o "$out"/framer_test &&
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/scenario_test.o "$out"/oam_*.o -o "$out"/scenario_test &&
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/quickstart.o "$out"/oam_*.o -o "$out"/quickstart &&
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/gamelayer.o "$out"/oam_*.o -o "$out"/gamelayer &&
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/orphan_test.o "$out"/oam_*.o -o "$out"/orphan_test
}

# the README's ```cpp blocks, verbatim (each rewritten only when it changed): 1 quick start, 2 game layer
extract_block() { # extract_block N NAME
    awk -v want="$1" '/^```cpp$/ {n++; on = (n == want); next} on && /^```$/ {exit} on {print}' \
        "$HERE/README.md" >"$BUILD/$2.cpp.new"
    cmp -s "$BUILD/$2.cpp.new" "$BUILD/$2.cpp" || mv "$BUILD/$2.cpp.new" "$BUILD/$2.cpp"
    rm -f "$BUILD/$2.cpp.new"
    [ -s "$BUILD/$2.cpp" ] || { echo "FAIL - no \`\`\`cpp block number $1 ($2) in README.md"; exit 1; }
}
extract_block 1 quickstart
extract_block 2 gamelayer

read -r -a BRIDGE_ARGV <<<"$OAM_BRIDGE_CMD"
if ! (cd "$ROOT" && command -v "${BRIDGE_ARGV[0]}" >/dev/null); then
    echo "FAIL - bridge command not found: ${BRIDGE_ARGV[0]} (build the venv, or set OAM_BRIDGE_CMD)"; exit 1
fi

echo "# build (g++ ${CXXFLAGS[*]})"
t0=$SECONDS
if build plain; then echo "ok   - build, no warnings ($((SECONDS - t0)) s)"; else echo "FAIL - build"; exit 1; fi

# The core as Unreal's Linux sysroot (glibc 2.17) sees it: functions glibc added later are
# poisoned by tests/old_glibc.h (posix_spawn_file_actions_addchdir_np needed 2.29).
if "$CXX" -std=c++17 -Wall -Wextra -Werror -fsyntax-only -include "$HERE/tests/old_glibc.h" -I"$CORE" \
        "$CORE"/oam_process.cpp "$CORE"/oam_client.cpp "$CORE"/oam_line_framer.cpp; then
    echo "ok   - core uses nothing newer than glibc 2.17 (Unreal's Linux sysroot; tests/old_glibc.h)"
else
    echo "FAIL - core uses a glibc function newer than Unreal's Linux sysroot (see tests/old_glibc.h)"; FAIL=1
fi

# The Windows path (CreateProcessW with STARTUPINFOEX + PROC_THREAD_ATTRIBUTE_HANDLE_LIST, the job
# object): compiled and linked with MinGW-w64 when it is installed (apt-get install
# g++-mingw-w64-x86-64-posix), not run (no Windows here). With OAM_REQUIRE_MINGW=1 its absence fails.
MINGW=${MINGW_CXX:-x86_64-w64-mingw32-g++-posix}
command -v "$MINGW" >/dev/null || MINGW=x86_64-w64-mingw32-g++
if command -v "$MINGW" >/dev/null; then
    mkdir -p "$BUILD/win/include"
    nl=$(echo '#include <nlohmann/json.hpp>' | "$CXX" -std=c++17 -E -H -x c++ - 2>&1 >/dev/null | awk '/nlohmann\/json.hpp/ {print $2; exit}')
    [ -n "$nl" ] && ln -sfn "$(dirname "$nl")" "$BUILD/win/include/nlohmann"
    if "$MINGW" -std=c++17 -O1 -Wall -Wextra -Werror -D_WIN32_WINNT=0x0A00 -I"$CORE" -I"$BUILD/win/include" \
            "$CORE"/oam_process.cpp "$CORE"/oam_client.cpp "$CORE"/oam_line_framer.cpp "$HERE"/tests/orphan_test.cpp \
            -static -o "$BUILD/win/orphan_test.exe"; then
        echo "ok   - Windows core compiles and links with MinGW-w64 ($MINGW; not run: no Windows here)"
    else
        echo "FAIL - Windows core does not compile with $MINGW"; FAIL=1
    fi
elif [ "${OAM_REQUIRE_MINGW:-0}" = 1 ]; then
    echo "FAIL - no MinGW-w64 compiler (OAM_REQUIRE_MINGW=1)"; FAIL=1
else
    echo "ok   - Windows core not compiled: no MinGW-w64 here (apt-get install g++-mingw-w64-x86-64-posix)  # SKIP"
fi

# The Unreal layer (Public/, Private/) compiled against tests/ue_stubs (declarations in the shape
# of Unreal's public API reference) and tests/uht_lite.py's generated code (GENERATED_BODY per
# line; the FVTableHelper constructor and the destructor defined in each header's .gen.cpp when
# the class does not declare them; UFUNCTION overloads and parameter types UHT rejects), then run
# against the bridge by tests/ue_layer_test.cpp. Not Unreal: no UHT, UBT or editor here.
UHT="$BUILD/uht"; rm -rf "$UHT"
UE_FLAGS=(-Woverloaded-virtual -I"$UHT" -I"$HERE/tests/ue_stubs" -I"$HERE/Source/OamBridge/Public" -I"$HERE/Source/OamBridge/Private")
if python3 "$HERE/tests/uht_lite.py" "$UHT" "$HERE"/Source/OamBridge/Public/*.h; then
    mkdir -p "$BUILD/ue"; pids=(); rc=0
    for src in "$HERE"/Source/OamBridge/Private/*.cpp "$UHT"/*.gen.cpp "$HERE/tests/ue_layer_test.cpp"; do
        "$CXX" "${CXXFLAGS[@]}" "${UE_FLAGS[@]}" -c "$src" -o "$BUILD/ue/$(basename "${src%.cpp}").o" & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if [ $rc -eq 0 ] && "$CXX" "${CXXFLAGS[@]}" "$BUILD"/ue/*.o "$BUILD"/plain/oam_*.o -o "$BUILD/ue/ue_layer_test"; then
        echo "ok   - Unreal layer and its .gen.cpp files compile and link against tests/ue_stubs (not a real Unreal build)"
    else
        echo "FAIL - Unreal layer does not compile against tests/ue_stubs"; FAIL=1
    fi
else
    FAIL=1
fi

cd "$ROOT"  # so `python -m bridge` finds the package
echo "# framer_test"
timeout 60 "$BUILD/plain/framer_test" || FAIL=1
echo "# scenario_test"
timeout 120 "$BUILD/plain/scenario_test" "$HERE/../scenario.json" || FAIL=1
# A crashing game never orphans the bridge: orphan_test (the "game") starts it through the client,
# prints its pid and waits; we kill the game with SIGKILL and give the bridge 1 s to be gone.
gone_within() { # gone_within PID SECONDS: true when PID is gone (or a zombie) in time
    local deadline=$((SECONDS + $2 + 1)) t0; t0=$(date +%s%N)
    while :; do
        if ! kill -0 "$1" 2>/dev/null || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; then
            GONE_MS=$((($(date +%s%N) - t0) / 1000000)); [ $GONE_MS -le $(($2 * 1000)) ]; return; fi
        [ $SECONDS -ge $deadline ] && { GONE_MS=-1; return 1; }
        sleep 0.02
    done
}
orphan_check() { # orphan_check LABEL ARGS... (orphan_test's arguments)
    local label=$1 fifo game line bpid; shift
    fifo=$(mktemp -u "$BUILD/orphan.XXXXXX"); mkfifo "$fifo"
    "$BUILD/plain/orphan_test" "$@" >"$fifo" 2>"$BUILD/orphan.err" & game=$!
    line=""; read -r -t 60 line <"$fifo"; rm -f "$fifo"
    bpid=${line#bridge-pid }
    if [ -z "$line" ] || [ "$bpid" = "$line" ] || ! kill -0 "$bpid" 2>/dev/null; then
        echo "FAIL - $label: the game did not report a running bridge ($line; $(head -c 300 "$BUILD/orphan.err"))"; kill -9 $game 2>/dev/null; FAIL=1; return
    fi
    kill -9 "$game"; wait "$game" 2>/dev/null
    if gone_within "$bpid" 1; then
        echo "ok   - $label: the bridge (pid $bpid) is gone ${GONE_MS} ms after the game's SIGKILL"
    else
        echo "FAIL - $label: the bridge (pid $bpid) outlived the game's SIGKILL by more than 1 s"; kill -9 "$bpid" 2>/dev/null; FAIL=1
    fi
}
echo "# game killed with SIGKILL"
orphan_check "bridge, initialized" "${BRIDGE_ARGV[@]}"
# A child that ignores stdin EOF: only the parent-death signal (Linux) can end it.
orphan_check "a child that ignores stdin EOF (parent-death signal)" --no-initialize sleep 30

# The Unreal layer at run time, with the bridge staged as the README's "Shipping your game" says:
# stage_bridge.sh copies make dist's folder into the plugin (here a scratch plugin folder); without
# a dist (or with OAM_BRIDGE_CMD set) a stand-in oam-bridge that runs $OAM_BRIDGE_CMD is staged.
if [ -x "$BUILD/ue/ue_layer_test" ]; then
    echo "# Unreal layer (tests/ue_layer_test.cpp)"
    PLUGIN="$BUILD/plugin"; rm -rf "$PLUGIN"; mkdir -p "$PLUGIN"
    if [ -z "$OVERRIDDEN" ] && [ -x "$ROOT/dist/oam-bridge/oam-bridge" ]; then
        OAM_PLUGIN_DIR="$PLUGIN" OAM_STAGE_LINK=1 "$HERE/stage_bridge.sh" "$ROOT/dist/oam-bridge" Linux >/dev/null
        which="make dist's bridge, staged by stage_bridge.sh"
    else
        mkdir -p "$PLUGIN/stand-in"
        printf '#!/bin/sh\ncd "%s" && exec %s "$@"\n' "$ROOT" "$OAM_BRIDGE_CMD" >"$PLUGIN/stand-in/oam-bridge"
        chmod +x "$PLUGIN/stand-in/oam-bridge"
        OAM_PLUGIN_DIR="$PLUGIN" "$HERE/stage_bridge.sh" "$PLUGIN/stand-in" Linux >/dev/null
        which="a stand-in running \$OAM_BRIDGE_CMD (no dist/oam-bridge)"
    fi
    echo "#    bridge: $which"
    (cd / && env -u OAM_BRIDGE_CMD OAM_STUB_PLUGIN_DIR="$PLUGIN" timeout 120 "$BUILD/ue/ue_layer_test" 2>"$BUILD/ue_layer.log") || {
        FAIL=1; echo "FAIL - ue_layer_test (log: $BUILD/ue_layer.log)"; tail -5 "$BUILD/ue_layer.log"; }
fi

echo "# README quick start"
if [ -n "$OVERRIDDEN" ]; then
    echo "ok   - quick start and game-layer example skipped (they hard-code the default command; OAM_BRIDGE_CMD is set)  # SKIP"
else
    qs=$(timeout 60 "$BUILD/plain/quickstart" 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -q "The north door is open." <<<"$qs" && grep -q '"output":{"opened":"north"}' <<<"$qs"; then
        echo "ok   - README quick start runs as printed (exit 0, tool answered, answer printed)"
    else
        echo "FAIL - README quick start (exit $rc): $qs"; FAIL=1
    fi
    gl=$(timeout 60 "$BUILD/plain/gamelayer" 2>&1); rc=$?
    want=("bram: prewarm, speaker null" "bram: decide, speaker null" "question because It is dark."
          "fallback: Let's talk about something else." 'bram: prewarm, speaker "Greta"' 'bram: respond, speaker "Greta"'
          "Quiet, Greta. (world revision 4)" "ale price; gate; history of the keep; season; "
          '{"deleted":true,"revision":5}')
    missing=""
    for w in "${want[@]}"; do grep -qxF -- "$w" <<<"$gl" || missing+=" [$w]"; done
    if [ $rc -eq 0 ] && [ -z "$missing" ]; then
        echo "ok   - README game-layer example runs as printed (exit 0, every line as commented)"
    else
        echo "FAIL - README game-layer example (exit $rc; missing:$missing): $gl"; FAIL=1
    fi
fi

san() { # san VARIANT FLAGS...
    local variant=$1; shift
    echo "# scenario_test under $variant"
    t0=$SECONDS
    if ! build "$variant" "$@"; then echo "FAIL - $variant build"; FAIL=1; return; fi
    if timeout 180 "$BUILD/$variant/framer_test" >/dev/null && \
       timeout 180 "$BUILD/$variant/scenario_test" "$HERE/../scenario.json" >"$BUILD/$variant.log" 2>&1; then
        echo "ok   - framer_test and scenario_test clean under $variant ($((SECONDS - t0)) s incl. build)"
    else
        echo "FAIL - under $variant (see $BUILD/$variant.log):"; grep -v '^ok' "$BUILD/$variant.log" | head -40; FAIL=1
    fi
}
if [ "${OAM_SANITIZE:-0}" = 1 ]; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        san asan-ubsan -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
fi
if [ "${OAM_TSAN:-0}" = 1 ]; then
    TSAN_OPTIONS="halt_on_error=1 suppressions=$HERE/tests/tsan.supp" san tsan -fsanitize=thread
fi

[ $FAIL -eq 0 ] && echo "unreal core: PASS" || echo "unreal core: FAIL"
exit $FAIL
