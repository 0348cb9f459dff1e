#!/usr/bin/env bash
# Builds the Unity client's engine-agnostic core (Runtime/*.cs, not Runtime/Unity) with Mono and
# runs Tests~/ScenarioTest.cs (../scenario.json) plus the README's examples against the bridge.
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

cd "$ROOT"   # so `python -m bridge` finds the package
exec mono --debug "$BUILD/ScenarioTest.exe" "$HERE/../scenario.json" "$ROOT"
