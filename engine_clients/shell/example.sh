#!/usr/bin/env bash
# Minimal example: one NPC that knows a world fact, prewarmed, one turn, print the streamed text.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"; . "$HERE/oam.sh"
oam_start "${OAM_BRIDGE_CMD:-$ROOT/.venv/bin/python -m bridge --engine scripted}"
oam_request initialize '{"protocolVersion":1,"clientInfo":{"name":"example.sh","version":"1"}}' >/dev/null
oam_request npc/create '{"npcId":"guard","instructions":"You guard the gate.","tags":["gate"]}' >/dev/null
oam_world_set gate '"closed for the night"' '{"tags":["gate"]}' >/dev/null
oam_wait_turn "$(oam_prewarm guard | jq -r .turnId)" >/dev/null
oam_respond guard "Let me in" >/dev/null
while ev=$(oam_next_event 10); do
    case $(jq -r .method <<<"$ev") in
        turn/started) printf '%s: ' "$(jq -r '.params.npcId' <<<"$ev")" ;;
        turn/textDelta) printf '%s' "$(jq -r .params.delta <<<"$ev")" ;;
        turn/completed) echo " (world revision $(jq .params.worldRevision <<<"$ev"))"; break ;;
        turn/failed) echo "failed: $(jq -c .params.error <<<"$ev")"; break ;;
    esac
done
oam_stop
