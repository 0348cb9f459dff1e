#!/usr/bin/env bash
# Minimal example: one NPC, one turn, print the streamed text.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"; . "$HERE/oam.sh"
oam_start "${OAM_BRIDGE_CMD:-$ROOT/.venv/bin/python -m bridge --engine scripted}"
oam_request initialize '{"protocolVersion":1,"clientInfo":{"name":"example.sh","version":"1"}}' >/dev/null
oam_request npc/create '{"npcId":"guard","instructions":"You guard the gate."}' >/dev/null
oam_request npc/respond '{"npcId":"guard","prompt":"Let me in"}' >/dev/null
while ev=$(oam_next_event 10); do
    case $(jq -r .method <<<"$ev") in
        turn/textDelta) printf '%s' "$(jq -r .params.delta <<<"$ev")" ;;
        turn/completed) echo; break ;;
        turn/failed) echo "failed: $(jq -c .params.error <<<"$ev")"; break ;;
    esac
done
oam_stop
