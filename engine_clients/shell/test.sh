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

# run_turn PARAMS [cancel]  -> collects events of the turn into TURN_EVENTS (JSON array)
run_turn() {
    local params=$1 mode=${2:-} tid ev m seq=0 cancelled=0
    tid=$(oam_request npc/respond "$params" | jq -r .turnId)
    [ -n "$tid" ] && [ "$tid" != null ] || { bad "respond returned no turnId"; return 1; }
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
                local s; s=$(oam_request npc/submit "$(jq -cn --arg c "$cid" '{npcId:"keeper",callId:$c,output:{count:3}}')")
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

run_turn "$(step_params respond_with_tool)"
E=$TURN_EVENTS
check "tool turn: started first" "$E" '.[0].method == "turn/started"'
check "tool turn: toolCallRequested check_inventory(ale)" "$E" \
    'any(.[]; .method=="turn/toolCallRequested" and .params.name=="check_inventory" and .params.arguments=={"item":"ale"})'
check "tool turn: toolCallCompleted output" "$E" \
    'any(.[]; .method=="turn/toolCallCompleted" and .params.output=={"count":3})'
check "tool turn: deltas concatenate to text" "$E" \
    '([.[] | select(.method=="turn/textDelta") | .params.delta] | join("")) == "We have 3 barrels of ale."'
check "tool turn: completed" "$E" \
    '.[-1].method=="turn/completed" and .[-1].params.text=="We have 3 barrels of ale." and .[-1].params.toolCalls[0].name=="check_inventory" and .[-1].params.toolCalls[0].output=={"count":3}'

run_turn "$(step_params schema_turn)"
check "schema turn: completed json" "$TURN_EVENTS" \
    '.[-1].method=="turn/completed" and .[-1].params.json=={"mood":"happy","line":"Welcome!"}'

run_turn "$(step_params cancel_turn)" cancel
check "cancel turn: failed cancelled" "$TURN_EVENTS" \
    '.[-1].method=="turn/failed" and .[-1].params.error.code=="cancelled" and all(.[]; .method!="turn/completed")'

save=$(oam_request npc/transcript '{"npcId":"keeper"}') || bad "transcript: $save"
check "transcript is an object" "$save" 'type=="object"'
r=$(oam_request npc/restore "$(jq -cn --argjson s "$save" '{save:$s,npcId:"keeper2"}')") || bad "restore: $r"
check "restore" "$r" '.npcId=="keeper2" and .turns >= 2'

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

[ $FAIL -eq 0 ] && echo "shell client: PASS" || echo "shell client: FAIL"
exit $FAIL
