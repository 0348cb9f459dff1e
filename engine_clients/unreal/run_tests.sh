#!/usr/bin/env bash
# Builds the engine-agnostic C++ core and its tests with g++ and runs them against the real
# bridge: framer unit test, scenario.json (tests/scenario_test.cpp), the README quick start
# (extracted from README.md, so it works as printed). Optional: OAM_SANITIZE=1 runs the tests
# again under AddressSanitizer + UBSan, OAM_TSAN=1 under ThreadSanitizer (each adds ~50 s of
# cold build). Objects in .build/ are reused when newer than their sources.
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

# build VARIANT EXTRA_FLAGS... -> $BUILD/VARIANT/{framer_test,scenario_test,quickstart}
build() {
    local variant=$1; shift
    local out="$BUILD/$variant" pids=() src obj rc=0
    mkdir -p "$out"
    for src in "$CORE"/oam_line_framer.cpp "$CORE"/oam_process.cpp "$CORE"/oam_client.cpp \
               "$HERE"/tests/framer_test.cpp "$HERE"/tests/scenario_test.cpp "$BUILD"/quickstart.cpp; do
        obj="$out/$(basename "${src%.cpp}").o"
        if [ "$obj" -nt "$src" ] && [ "$obj" -nt "$HERE/run_tests.sh" ] && ! newer_header "$obj"; then continue; fi
        "$CXX" "${CXXFLAGS[@]}" "$@" -c "$src" -o "$obj" & pids+=($!)
    done
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || rc=1; done
    [ $rc -eq 0 ] || return 1
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/framer_test.o "$out"/oam_line_framer.o "$out"/oam_process.o -o "$out"/framer_test &&
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/scenario_test.o "$out"/oam_*.o -o "$out"/scenario_test &&
    "$CXX" "${CXXFLAGS[@]}" "$@" "$out"/quickstart.o "$out"/oam_*.o -o "$out"/quickstart
}

# the README's first ```cpp block, verbatim (rewritten only when it changed)
awk '/^```cpp$/ {on=1; next} on && /^```$/ {exit} on {print}' "$HERE/README.md" >"$BUILD/quickstart.cpp.new"
cmp -s "$BUILD/quickstart.cpp.new" "$BUILD/quickstart.cpp" || mv "$BUILD/quickstart.cpp.new" "$BUILD/quickstart.cpp"
rm -f "$BUILD/quickstart.cpp.new"
[ -s "$BUILD/quickstart.cpp" ] || { echo "FAIL - no \`\`\`cpp block in README.md"; exit 1; }

read -r -a BRIDGE_ARGV <<<"$OAM_BRIDGE_CMD"
if ! (cd "$ROOT" && command -v "${BRIDGE_ARGV[0]}" >/dev/null); then
    echo "FAIL - bridge command not found: ${BRIDGE_ARGV[0]} (build the venv, or set OAM_BRIDGE_CMD)"; exit 1
fi

echo "# build (g++ ${CXXFLAGS[*]})"
t0=$SECONDS
if build plain; then echo "ok   - build, no warnings ($((SECONDS - t0)) s)"; else echo "FAIL - build"; exit 1; fi

# The Unreal layer cannot be compiled without the engine; type-check it against tests/ue_stubs
# (hand-written stand-ins for the few UE declarations it uses: catches C++ mistakes, not UE ones).
if "$CXX" -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$HERE/tests/ue_stubs" -I"$HERE/Source/OamBridge/Public" \
        -I"$CORE" "$HERE"/Source/OamBridge/Private/*.cpp; then
    echo "ok   - Unreal layer type-checks against UE stubs (not a real Unreal build)"
else
    echo "FAIL - Unreal layer does not type-check against tests/ue_stubs"; FAIL=1
fi

cd "$ROOT"  # so `python -m bridge` finds the package
echo "# framer_test"
timeout 60 "$BUILD/plain/framer_test" || FAIL=1
echo "# scenario_test"
timeout 120 "$BUILD/plain/scenario_test" "$HERE/../scenario.json" || FAIL=1
echo "# README quick start"
if [ -n "$OVERRIDDEN" ]; then
    echo "ok   - quick start skipped (it hard-codes the default command; OAM_BRIDGE_CMD is set)  # SKIP"
else
    qs=$(timeout 60 "$BUILD/plain/quickstart" 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -q "The north door is open." <<<"$qs" && grep -q '"output":{"opened":"north"}' <<<"$qs"; then
        echo "ok   - README quick start runs as printed (exit 0, tool answered, answer printed)"
    else
        echo "FAIL - README quick start (exit $rc): $qs"; FAIL=1
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
