#!/usr/bin/env bash
# Runs engine_clients/scenario.json against the real bridge with oam.sh.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SCEN="$HERE/../scenario.json"
: "${OAM_BRIDGE_CMD:=$ROOT/.venv/bin/python -m bridge --engine scripted}"
cd "$ROOT"   # so `python -m bridge` finds the package
. "$HERE/oam.sh"

FAIL=0
ok()   { echo "ok   - $*"; }
bad()  { echo "FAIL - $*"; FAIL=1; }
check() { # check DESC JSON JQ_BOOL_EXPR
    if jq -e "$3" <<<"$2" >/dev/null 2>&1; then ok "$1"; else bad "$1: $3 on $2"; fi
}
step_params() { jq -c --arg n "$1" '.steps[] | select(.name==$n) | .request.params' "$SCEN"; }

oam_start "$OAM_BRIDGE_CMD" || exit 1

r=$(oam_request initialize "$(step_params initialize)") || bad "initialize: $r"
check initialize "$r" '.protocolVersion == 1 and (.serverInfo.name|type=="string")'

r=$(oam_request npc/create "$(step_params create_keeper)") || bad "create: $r"
check create "$r" '.npcId == "keeper" and .engine == "scripted"'

# run_turn [--cancel] CMD [ARGS...]: CMD starts a turn (oam_respond, oam_decide, oam_prewarm,
# oam_request npc/respond ...) and prints {npcId, turnId}; collects the turn's events into
# TURN_EVENTS (JSON array), answers its tool calls, cancels after the first delta if asked.
run_turn() {
    local mode= tid ev m seq=0 cancelled=0
    [ "$1" = --cancel ] && { mode=cancel; shift; }
    tid=$("$@" | jq -r .turnId)
    [ -n "$tid" ] && [ "$tid" != null ] || { bad "$1 returned no turnId"; return 1; }
    TURN_EVENTS='[]'
    while ev=$(oam_next_event 20); do
        m=$(jq -r .method <<<"$ev")
        TURN_EVENTS=$(jq -c --argjson e "$ev" '. + [$e]' <<<"$TURN_EVENTS")
        jq -e --arg t "$tid" --argjson s "$seq" '.params.turnId==$t and .params.seq==$s' <<<"$ev" >/dev/null \
            || bad "event $m has wrong turnId/seq (want seq $seq): $ev"
        seq=$((seq + 1))
        case $m in
            turn/toolCallRequested)
                local cid; cid=$(jq -r .params.callId <<<"$ev")
                local s; s=$(oam_request npc/submit "$(jq -c '{npcId:.params.npcId,callId:.params.callId,output:{count:3}}' <<<"$ev")")
                check "submit accepted" "$s" '.accepted == true' ;;
            turn/textDelta)
                if [ "$mode" = cancel ] && [ $cancelled = 0 ]; then
                    cancelled=1
                    local c; c=$(oam_request npc/cancel '{"npcId":"keeper"}')
                    check "cancel lists turn" "$c" ".cancelled | index(\"$tid\") != null"
                fi ;;
            turn/completed|turn/failed) return 0 ;;
        esac
    done
    bad "turn $tid: no terminal event"; return 1
}

run_turn oam_request npc/respond "$(step_params respond_with_tool)"
E=$TURN_EVENTS
check "tool turn: started first" "$E" '.[0].method == "turn/started"'
check "tool turn: started by the player (speaker null), kind respond" "$E" \
    '.[0].params.speaker == null and .[0].params.kind == "respond"'
check "tool turn: toolCallRequested check_inventory(ale)" "$E" \
    'any(.[]; .method=="turn/toolCallRequested" and .params.name=="check_inventory" and .params.arguments=={"item":"ale"})'
check "tool turn: toolCallCompleted output" "$E" \
    'any(.[]; .method=="turn/toolCallCompleted" and .params.output=={"count":3})'
check "tool turn: deltas concatenate to text" "$E" \
    '([.[] | select(.method=="turn/textDelta") | .params.delta] | join("")) == "We have 3 barrels of ale."'
check "tool turn: completed" "$E" \
    '.[-1].method=="turn/completed" and .[-1].params.text=="We have 3 barrels of ale." and .[-1].params.toolCalls[0].name=="check_inventory" and .[-1].params.toolCalls[0].output=={"count":3}'

run_turn oam_request npc/respond "$(step_params schema_turn)"
check "schema turn: completed json" "$TURN_EVENTS" \
    '.[-1].method=="turn/completed" and .[-1].params.json=={"mood":"happy","line":"Welcome!"}'

run_turn --cancel oam_request npc/respond "$(step_params cancel_turn)"
check "cancel turn: failed cancelled" "$TURN_EVENTS" \
    '.[-1].method=="turn/failed" and .[-1].params.error.code=="cancelled" and all(.[]; .method!="turn/completed")'

save=$(oam_request npc/transcript '{"npcId":"keeper"}') || bad "transcript: $save"
check "transcript is an object" "$save" 'type=="object"'
r=$(oam_request npc/restore "$(jq -cn --argjson s "$save" '{save:$s,npcId:"keeper2"}')") || bad "restore: $r"
check "restore" "$r" '.npcId=="keeper2" and .turns >= 2'

# The game layer: world facts, a decision, guardrail fallback, NPC to NPC, prewarm, tags.
world_set_step() { # world_set_step NAME: oam_world_set KEY VALUE SCOPE from the step's params
    local p; p=$(step_params "$1")
    oam_world_set "$(jq -r .key <<<"$p")" "$(jq -c .value <<<"$p")" "$(jq -c 'del(.key, .value)' <<<"$p")"
}
r=$(world_set_step world_set) || bad "world_set: $r"
check "world_set: revision 1" "$r" '.revision == 1'

r=$(oam_request npc/create "$(step_params create_guard)") || bad "create guard: $r"
check "create guard (tags, fallbacks)" "$r" '.npcId == "guard"'

r=$(world_set_step world_set_scoped) || bad "world_set scoped: $r"
check "world_set scoped to gate: revision 2" "$r" '.revision == 2'

r=$(oam_world_get guard) || bad "world_get guard: $r"
check "world_get guard: revision 2, only the fact gate (weather is for the tavern)" "$r" \
    '.revision == 2 and (.facts | length == 1) and .facts[0].key == "gate" and .facts[0].value == "closed" and .facts[0].tags == ["gate"] and .facts[0].npcIds == null and .facts[0].lore == false'

p=$(step_params decide)
run_turn oam_decide guard "$(jq -r .situation <<<"$p")" "$(jq -c .options <<<"$p")"
E=$TURN_EVENTS
check "decide: started kind decide" "$E" '.[0].method == "turn/started" and .[0].params.kind == "decide"'
check "decide: completed choice question with reasoning, worldRevision 2" "$E" \
    '.[-1].method == "turn/completed" and .[-1].params.json.choice == "question" and .[-1].params.json.reasoning == "It is late and I do not know them." and .[-1].params.worldRevision == 2'
check "decide: partialJson deltas (if any) build the JSON" "$E" \
    '[.[] | select(.method=="turn/partialJson") | .params.delta] | length == 0 or (join("") | fromjson) == {"reasoning":"It is late and I do not know them.","choice":"question"}'

p=$(step_params guardrail_fallback)
run_turn oam_respond guard "$(jq -r .prompt <<<"$p")" "$(jq -c '{guardrail}' <<<"$p")"
E=$TURN_EVENTS
check "guardrail fallback: started kind respond" "$E" '.[0].method == "turn/started" and .[0].params.kind == "respond"'
check "guardrail fallback: completed with the fallback line" "$E" \
    '.[-1].method == "turn/completed" and .[-1].params.text == "Let'"'"'s talk about something else." and .[-1].params.finishReason == "fallback" and (.[-1].params.warnings[0] | startswith("guardrail_violation"))'
check "guardrail fallback: deltas (if any) show the line" "$E" \
    '[.[] | select(.method=="turn/textDelta")] as $d | ($d | length == 0) or ($d | reduce .[].params as $e (""; if $e.isReset then $e.delta else . + $e.delta end)) == .[-1].params.text'

p=$(step_params npc_to_npc)
run_turn oam_respond guard "$(jq -r .prompt <<<"$p")" "$(jq -c '{speaker}' <<<"$p")"
E=$TURN_EVENTS
check "npc to npc: started speaker keeper" "$E" \
    '.[0].method == "turn/started" and .[0].params.speaker == "keeper" and .[0].params.prompt == "Heard about the weather?"'
check "npc to npc: completed, deltas concatenate to the text" "$E" \
    '.[-1].method == "turn/completed" and .[-1].params.text == "The storm is coming, friend." and ([.[] | select(.method=="turn/textDelta") | .params.delta] | join("")) == .[-1].params.text'

run_turn oam_prewarm guard
check "prewarm: started kind prewarm, then completed prewarmed, steps 0, text empty" "$TURN_EVENTS" \
    'length == 2 and .[0].method == "turn/started" and .[0].params.kind == "prewarm" and .[1].method == "turn/completed" and .[1].params.finishReason == "prewarmed" and .[1].params.steps == 0 and .[1].params.text == ""'
run_turn oam_prewarm guard keeper "Heard about"
check "prewarm with a speaker and a prefix: started with speaker keeper and the prefix as prompt, then prewarmed" "$TURN_EVENTS" \
    '.[0].params.kind == "prewarm" and .[0].params.speaker == "keeper" and .[0].params.prompt == "Heard about" and .[-1].params.finishReason == "prewarmed"'
run_turn oam_prewarm guard "" "Well,"
check "prewarm with a prefix only: speaker null (the player)" "$TURN_EVENTS" \
    '.[0].params.kind == "prewarm" and .[0].params.speaker == null and .[0].params.prompt == "Well," and .[-1].params.finishReason == "prewarmed"'

mapfile -t tags < <(step_params set_tags | jq -r '.tags[]')
r=$(oam_set_tags guard "${tags[@]}") || bad "set_tags: $r"
check "set_tags: result {}" "$r" '. == {}'

r=$(oam_world_get guard) || bad "world_get after tags: $r"
check "world_get guard after set_tags: gate, weather" "$r" '[.facts[].key] == ["gate","weather"]'

r=$(oam_world_delete weather) || bad "world_delete: $r"
check "world_delete: revision 3, deleted" "$r" '.revision == 3 and .deleted == true'

# oam_wait_turn: waits for one turn's end; the events of other turns stay queued, in order.
t1=$(oam_prewarm keeper2) && t2=$(oam_prewarm guard) || bad "wait_turn setup: $t1 $t2"
t2=$(jq -r .turnId <<<"$t2"); t1=$(jq -r .turnId <<<"$t1")
r=$(oam_wait_turn "$t2" 20); rc=$?
check "oam_wait_turn: prints the turn's completed event (exit $rc)" "$r" \
    ".method == \"turn/completed\" and .params.turnId == \"$t2\" and $rc == 0"
r=$(oam_wait_turn "$t1" 20); rc=$?
check "oam_wait_turn: the other turn's events were kept (exit $rc)" "$r" \
    ".method == \"turn/completed\" and .params.turnId == \"$t1\" and $rc == 0"
r=$(oam_world_set bad 'not json' 2>/dev/null); rc=$?
check "a helper's argument that is not JSON: exit 1, invalid_params, nothing sent" "$r" \
    ".data.code == \"invalid_params\" and $rc == 1"

if r=$(oam_request npc/respond '{"npcId":"nobody","prompt":"hi"}'); then
    bad "unknown npc accepted: $r"
else
    check "unknown_npc error" "$r" '.code == -31020 and .data.code == "unknown_npc"'
fi

oam_stop; rc=$?
[ $rc -eq 0 ] && ok "bridge exited 0" || bad "bridge exit code $rc"

# A bridge that is gone is reported and never kills the calling shell. Run from another
# directory, the quick start's relative command is not found: oam_start says so. A bridge that
# exits (here: closes its stdin, says so on stdout, exits 3 half a second later): the request
# returns 1 and the shell lives on; a write to it used to kill the shell silently (SIGPIPE, 141).
SCRATCH=$(mktemp -d)
cat >"$SCRATCH/closes_stdin.sh" <<'EOS'
#!/usr/bin/env bash
exec 0<&-
echo '{"jsonrpc":"2.0","method":"test/stdinClosed","params":{}}'
sleep 0.5
exit 3
EOS
chmod +x "$SCRATCH/closes_stdin.sh"
out=$(cd "$SCRATCH" && bash -c '
    . "$1"
    oam_start ".venv/bin/python -m bridge --engine scripted"; echo "start=$?"
    oam_start "$2"; echo "start=$?"
    oam_next_event 5 >/dev/null; echo "event=$?"
    oam_request initialize "{}" >/dev/null; echo "request=$?"
    oam_stop; echo "stop=$?"' _ "$HERE/oam.sh" "$SCRATCH/closes_stdin.sh" 2>&1); rc=$?
rm -rf "$SCRATCH"
want="start=1 start=0 event=0 request=1 stop=3"
got=$(grep -o '^[a-z]*=[0-9]*$' <<<"$out" | tr '\n' ' ' | sed 's/ $//')
[ $rc -eq 0 ] && [ "$got" = "$want" ] && ok "gone bridge: statuses $want, shell survives" \
    || bad "gone bridge: shell exit $rc, statuses '$got' (want '$want'): $out"
grep -q "bridge command not found: .venv/bin/python" <<<"$out" && ok "gone bridge: command not found is named" \
    || bad "gone bridge: no 'command not found' message: $out"
grep -q "cannot send: the bridge is not running" <<<"$out" && ok "gone bridge: failed send is named" \
    || bad "gone bridge: no 'not running' message: $out"

# The params the helpers send, as a fake bridge that answers each request with its params sees
# them: oam_prewarm sends speaker and promptPrefix only when given.
SCRATCH=$(mktemp -d)
cat >"$SCRATCH/echo_params.sh" <<'EOS'
#!/usr/bin/env bash
while IFS= read -r l; do
    [ "$(jq -r .method <<<"$l")" = exit ] && exit 0
    jq -c 'select(has("id")) | {jsonrpc: "2.0", id, result: .params}' <<<"$l"
done
EOS
chmod +x "$SCRATCH/echo_params.sh"
out=$(bash -c '
    . "$1"
    oam_start "$2" || exit 1
    oam_prewarm g; oam_prewarm g keeper "Heard about"; oam_prewarm g "" "Well,"
    oam_stop' _ "$HERE/oam.sh" "$SCRATCH/echo_params.sh" 2>&1); rc=$?
rm -rf "$SCRATCH"
want='{"npcId":"g"}
{"npcId":"g","speaker":"keeper","promptPrefix":"Heard about"}
{"npcId":"g","promptPrefix":"Well,"}'
[ $rc -eq 0 ] && [ "$out" = "$want" ] && ok "oam_prewarm's params: speaker and promptPrefix only when given" \
    || bad "oam_prewarm's params (exit $rc): $out"

# The game crashing never orphans the bridge: a game script killed with SIGKILL (its traps
# never run, oam_stop is never called) takes its bridge within a second.
game_out=$(mktemp)
bash -c '. "$1"; oam_start "$2"; oam_request initialize "{\"protocolVersion\":1}" >/dev/null; echo "$OAM_PID"; sleep 60' \
    _ "$HERE/oam.sh" "$OAM_BRIDGE_CMD" >"$game_out" 2>/dev/null &
game=$!
for _ in $(seq 100); do [ -s "$game_out" ] && break; sleep 0.05; done
bridge_pid=$(head -n1 "$game_out"); rm -f "$game_out"
kill -KILL "$game"; wait "$game" 2>/dev/null
gone=no
for _ in $(seq 20); do  # 20 x 50 ms
    if ! kill -0 "$bridge_pid" 2>/dev/null || grep -q '^State:.*Z' "/proc/$bridge_pid/status" 2>/dev/null; then gone=yes; break; fi
    sleep 0.05
done
[ -n "$bridge_pid" ] && [ $gone = yes ] && ok "a game killed with SIGKILL takes its bridge within 1 s" \
    || { bad "the bridge (pid ${bridge_pid:-?}) outlived its killed game by 1 s"; kill -KILL "$bridge_pid" 2>/dev/null; }

# The README's "Shipping your game" snippet, against the self-contained build (make dist),
# from a folder laid out as a shipped game, with a bare environment.
if [ -x "$ROOT/dist/oam-bridge/oam-bridge" ]; then
    game=$(mktemp -d)
    cp "$HERE/oam.sh" "$game/"
    ln -s "$ROOT/dist/oam-bridge" "$game/oam-bridge"
    awk '/^## Shipping your game/ {s=1} s && /^```sh$/ {b=1; next} b && /^```$/ {exit} b' "$HERE/README.md" \
        | sed 's/--engine llama/--engine scripted/' >"$game/game.sh"
    cat >>"$game/game.sh" <<'GAME'
oam_request initialize '{"protocolVersion":1}' | jq -r .serverInfo.name
oam_request npc/create '{"npcId":"g","script":[{"text":"Shipped."}]}' >/dev/null
t=$(oam_request npc/respond '{"npcId":"g","prompt":"hi"}' | jq -r .turnId)
while ev=$(oam_next_event 10); do
    [ "$(jq -r .method <<<"$ev")" = turn/completed ] && { jq -r .params.text <<<"$ev"; break; }
done
oam_stop
GAME
    out=$(cd / && env -i PATH=/usr/bin:/bin bash "$game/game.sh" 2>&1)
    rm -rf "$game"
    [ "$out" = "$(printf 'oam-bridge\nShipped.')" ] && ok "shipping: the README snippet runs the built bridge in a bare environment" \
        || bad "shipping: the README snippet against dist/oam-bridge printed: $out"
elif [ "${CI:-}" = true ]; then
    bad "shipping: dist/oam-bridge/oam-bridge is not built (make dist; tests/shipping/test_dist.py builds it in make test)"
else
    echo "skip - shipping: dist/oam-bridge not built (make dist)"
fi

[ $FAIL -eq 0 ] && echo "shell client: PASS" || echo "shell client: FAIL"
exit $FAIL
