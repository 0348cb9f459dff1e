#!/usr/bin/env bash
# Builds the Unity client's engine-agnostic core (Runtime/*.cs) with Mono and runs
# Tests~/ScenarioTest.cs (../scenario.json) plus the README's examples against the bridge; then
# compiles the Unity layer, the editor build step and the sample against UnityEngine/UnityEditor
# stubs (Tests~/Stubs) and runs Tests~/Unity/UnityLayerTest.cs (its shipping test runs the real
# dist/oam-bridge from a player build's StreamingAssets when it is built; a FAIL with CI=true when
# it is not); then kills a "game" with SIGKILL and checks its bridge is gone within 1 s.
# Needs mcs + mono (apt: mono-mcs) and Newtonsoft.Json (apt: libnewtonsoft-json-cil-dev).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD="$HERE/.build"
mkdir -p "$BUILD"

NEWTONSOFT=""
for dll in /usr/lib/cli/Newtonsoft.Json-5.0/Newtonsoft.Json.dll /usr/lib/cli/Newtonsoft.Json*/Newtonsoft.Json.dll; do
    [ -f "$dll" ] && { NEWTONSOFT=$dll; break; }
done
if [ -z "$NEWTONSOFT" ] && pkg-config --exists newtonsoft-json 2>/dev/null; then
    NEWTONSOFT=$(pkg-config --libs newtonsoft-json | sed 's/^-r://; s/ *$//')
fi
[ -n "$NEWTONSOFT" ] && [ -f "$NEWTONSOFT" ] || { echo "Newtonsoft.Json.dll not found (apt-get install -y libnewtonsoft-json-cil-dev)"; exit 1; }

# every ```csharp block of the README (quick start, game layer), compiled as it is printed;
# ```cs blocks (the Unity layer) are not
rm -f "$BUILD"/Readme*.g.cs
awk -v dir="$BUILD" '/^```csharp$/ {n++; f = sprintf("%s/Readme%d.g.cs", dir, n); on = 1; next}
    /^```$/ && on {on = 0; close(f); next} on {print > f}' "$HERE/README.md"
mapfile -t README < <(find "$BUILD" -maxdepth 1 -name 'Readme*.g.cs' | sort)
[ ${#README[@]} -gt 0 ] || { echo "no csharp block in README.md"; exit 1; }

mapfile -t RUNTIME < <(find "$HERE/Runtime" -maxdepth 1 -name '*.cs' | sort)
mapfile -t TESTS < <(find "$HERE/Tests~" -maxdepth 1 -name '*.cs' | sort)
echo "== mcs: ${#RUNTIME[@]} runtime + ${#TESTS[@]} test files + ${#README[@]} README blocks"
mcs -langversion:7 -debug -warn:4 -target:library -out:"$BUILD/OamBridge.Runtime.dll" \
    -r:"$NEWTONSOFT" "${RUNTIME[@]}"
mcs -langversion:7 -debug -warn:4 -target:exe -out:"$BUILD/ScenarioTest.exe" \
    -r:"$NEWTONSOFT" -r:"$BUILD/OamBridge.Runtime.dll" "${TESTS[@]}" "${README[@]}"
cp -f "$NEWTONSOFT" "$BUILD/"

# the Unity layer (Runtime/Unity), the editor build step (Editor/) and the sample (Samples~), compiled
# against stubs of UnityEngine/UnityEditor copied in shape from Unity's C# reference (Tests~/Stubs),
# then run by Tests~/Unity/UnityLayerTest.cs against the real bridge
mapfile -t UNITY < <(find "$HERE/Runtime/Unity" -maxdepth 1 -name '*.cs' | sort)
mapfile -t EDITOR < <(find "$HERE/Editor" -maxdepth 1 -name '*.cs' | sort)
mapfile -t SAMPLE < <(find "$HERE/Samples~" -name '*.cs' | sort)
echo "== mcs: UnityEngine/UnityEditor stubs, ${#UNITY[@]} Unity layer + ${#EDITOR[@]} editor + ${#SAMPLE[@]} sample files"
MCS=(mcs -langversion:7 -debug -warn:4 -warnaserror+ -nowarn:1591)
"${MCS[@]}" -target:library -nowarn:414 -out:"$BUILD/UnityEngine.dll" "$HERE/Tests~/Stubs/UnityEngine.cs"
"${MCS[@]}" -target:library -out:"$BUILD/UnityEditor.dll" -r:"$BUILD/UnityEngine.dll" "$HERE/Tests~/Stubs/UnityEditor.cs"
"${MCS[@]}" -target:library -out:"$BUILD/OamBridge.Unity.dll" -r:"$NEWTONSOFT" -r:"$BUILD/OamBridge.Runtime.dll" \
    -r:"$BUILD/UnityEngine.dll" "${UNITY[@]}"
"${MCS[@]}" -target:library -out:"$BUILD/OamBridge.Editor.dll" -r:"$BUILD/OamBridge.Runtime.dll" \
    -r:"$BUILD/OamBridge.Unity.dll" -r:"$BUILD/UnityEngine.dll" -r:"$BUILD/UnityEditor.dll" "${EDITOR[@]}"
"${MCS[@]}" -target:library -out:"$BUILD/OamBridge.Sample.dll" -r:"$NEWTONSOFT" -r:"$BUILD/OamBridge.Runtime.dll" \
    -r:"$BUILD/OamBridge.Unity.dll" -r:"$BUILD/UnityEngine.dll" "${SAMPLE[@]}"
"${MCS[@]}" -target:exe -out:"$BUILD/UnityLayerTest.exe" -r:"$NEWTONSOFT" -r:"$BUILD/OamBridge.Runtime.dll" \
    -r:"$BUILD/OamBridge.Unity.dll" -r:"$BUILD/OamBridge.Editor.dll" -r:"$BUILD/OamBridge.Sample.dll" \
    -r:"$BUILD/UnityEngine.dll" -r:"$BUILD/UnityEditor.dll" "$HERE/Tests~/Unity/UnityLayerTest.cs"

cd "$ROOT"   # so `python -m bridge` finds the package
STATUS=0
echo "== core: scenario against the bridge"
mono --debug "$BUILD/ScenarioTest.exe" "$HERE/../scenario.json" "$ROOT" || STATUS=1
echo "== Unity layer against the bridge"
mono --debug "$BUILD/UnityLayerTest.exe" "$ROOT" "$HERE" || STATUS=1

# the game crashes: a "game" starts the bridge through OamNpc, is killed with SIGKILL, and the
# bridge must be gone within 1 s (it exits on stdin EOF)
echo "== SIGKILL of the game"
PIDFILE=$(mktemp -u "${TMPDIR:-/tmp}/oam-unity-game.XXXXXX")
mono --debug "$BUILD/UnityLayerTest.exe" --game "$PIDFILE" "$ROOT" &
GAME=$!
for _ in $(seq 1 400); do [ -s "$PIDFILE" ] || ! kill -0 "$GAME" 2>/dev/null && break; sleep 0.05; done
if [ ! -s "$PIDFILE" ]; then
    echo "FAIL - the game did not start the bridge"; kill -9 "$GAME" 2>/dev/null; STATUS=1
else
    BRIDGE=$(cat "$PIDFILE"); rm -f "$PIDFILE"
    gone() { [ ! -e "/proc/$1" ] || [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" = Z ]; }
    if gone "$BRIDGE"; then echo "FAIL - the bridge $BRIDGE was not running"; STATUS=1; fi
    START=$(date +%s%N)
    kill -9 "$GAME"; wait "$GAME" 2>/dev/null || true
    while ! gone "$BRIDGE" && [ $(( ($(date +%s%N) - START) / 1000000 )) -lt 1000 ]; do sleep 0.02; done
    MS=$(( ($(date +%s%N) - START) / 1000000 ))
    if gone "$BRIDGE"; then echo "ok   - game killed with SIGKILL: the bridge exited within 1 s (${MS} ms)"
    else echo "FAIL - game killed with SIGKILL: the bridge $BRIDGE still runs after ${MS} ms"; kill -9 "$BRIDGE"; STATUS=1; fi
fi
exit $STATUS
