#!/usr/bin/env bash
# oam.sh - bash client for the oam-bridge (line-delimited JSON-RPC 2.0 on stdin/stdout).
# Source it:  . oam.sh ; needs bash >= 4.3 and jq.
#
#   oam_start [CMD...]              start the bridge as a coproc (default: $OAM_BRIDGE_CMD)
#   oam_request METHOD [PARAMS]     send a request, wait for its response; prints the result
#                                   JSON (exit 0) or the error object JSON (exit 1). Also sets
#                                   OAM_RESULT / OAM_ERROR when not called in a subshell.
#   oam_notify METHOD [PARAMS]      send a notification (e.g. exit)
#   oam_next_event [TIMEOUT_S]      print the next notification {"method":..,"params":..};
#                                   exit 1 on timeout, 2 if the bridge closed its stdout
#   oam_stop                        shutdown + exit; waits; returns the bridge's exit code
#
# Helpers for the game layer (each prints what oam_request prints and returns its status):
#   oam_respond NPC PROMPT [EXTRA]  npc/respond; EXTRA: more params as JSON, e.g.
#                                   '{"speaker":"keeper"}' (NPC to NPC), '{"guardrail":"fallback"}'
#   oam_decide NPC SITUATION OPTIONS [EXTRA]
#                                   npc/decide; OPTIONS a JSON array of {name, description,
#                                   parameters?}; EXTRA e.g. '{"reasoning":false,"remember":true}'
#   oam_prewarm NPC [SPEAKER [PROMPT_PREFIX]]
#                                   npc/prewarm; SPEAKER: who speaks to NPC next (another NPC's
#                                   id or a name; "" or absent: the player), PROMPT_PREFIX: how
#                                   that line starts; each is sent only when not empty
#   oam_set_tags NPC [TAG...]       npc/setTags (replaces the NPC's tags)
#   oam_world_set KEY VALUE [SCOPE] world/set; VALUE is JSON ('"closed"' for a string); SCOPE
#                                   JSON, e.g. '{"tags":["tavern"]}', '{"npcIds":["guard"]}',
#                                   '{"lore":true}'
#   oam_world_delete KEY            world/delete
#   oam_world_get [NPC]             world/get (every fact, or those NPC can see)
#   oam_wait_turn TURN_ID [TIMEOUT_S]
#                                   wait for the turn's terminal event and print it: exit 0 on
#                                   turn/completed, 1 on turn/failed, 2 when no event came for
#                                   TIMEOUT_S or the bridge closed. The turn's other events are
#                                   skipped (a turn whose tool calls the game answers needs
#                                   oam_next_event); other turns' events stay queued, in order.
# An argument documented as JSON that is not JSON: exit 1 and an invalid_params error object,
# nothing sent.
#
# State (request id counter, queued events) lives in files under $OAM_DIR, so the functions
# also work inside $(...) subshells. Events that arrive while oam_request waits are queued.
# A relative bridge command resolves against the current directory. When the bridge is gone
# (it exited, or never started), calls return 1 and say so on stderr with the end of the
# bridge's stderr; they never kill the calling shell.

OAM_TIMEOUT=${OAM_TIMEOUT:-30}

oam_start() {
    command -v jq >/dev/null || { echo "oam.sh: jq is required" >&2; return 1; }
    local cmd
    if [ $# -gt 0 ]; then cmd="$*"; else cmd=${OAM_BRIDGE_CMD:?set OAM_BRIDGE_CMD or pass a command}; fi
    local argv; read -r -a argv <<<"$cmd"
    command -v "${argv[0]:-}" >/dev/null || {
        echo "oam.sh: bridge command not found: ${argv[0]:-} (from $PWD; use an absolute path or cd first)" >&2
        return 1
    }
    OAM_DIR=$(mktemp -d "${TMPDIR:-/tmp}/oam.XXXXXX")
    : >"$OAM_DIR/events"; echo 0 >"$OAM_DIR/id"
    # shellcheck disable=SC2086
    coproc OAM_BRIDGE { exec $cmd 2>"$OAM_DIR/stderr"; }
    OAM_PID=$OAM_BRIDGE_PID
    # dup the coproc fds onto ordinary fds: those survive into subshells
    exec {OAM_TO}>&"${OAM_BRIDGE[1]}" {OAM_FROM}<&"${OAM_BRIDGE[0]}"
    export OAM_DIR
}

# Say on stderr that the bridge is gone, with the end of its stderr.
_oam_gone() {
    if [ -s "$OAM_DIR/stderr" ]; then
        echo "oam.sh: $1: the bridge is not running; the end of its stderr:" >&2
        tail -n 5 "$OAM_DIR/stderr" | sed 's/^/  /' >&2
    else
        echo "oam.sh: $1: the bridge is not running (its stderr is empty)" >&2
    fi
}

# The write runs in a subshell that ignores SIGPIPE: writing to a bridge that has exited then
# fails with EPIPE instead of killing the caller's shell (silently, exit status 141).
_oam_send() {
    [ -n "${OAM_TO:-}" ] || { echo "oam.sh: no bridge: call oam_start first" >&2; return 1; }
    ( trap '' PIPE; printf '%s\n' "$1" >&"$OAM_TO" ) 2>/dev/null || { _oam_gone "cannot send"; return 1; }
}

# read one line from the bridge into _OAM_LINE; 1 = timeout, 2 = EOF
_oam_read() {
    local t=${1:-$OAM_TIMEOUT} rc
    IFS= read -r -t "$t" -u "$OAM_FROM" _OAM_LINE; rc=$?
    [ $rc -eq 0 ] && return 0
    [ $rc -gt 128 ] && return 1
    return 2
}

oam_notify() {
    local method=$1 params=${2:-}
    if [ -n "$params" ]; then
        _oam_send "$(jq -cn --arg m "$method" --argjson p "$params" '{jsonrpc:"2.0",method:$m,params:$p}')"
    else
        _oam_send "$(jq -cn --arg m "$method" '{jsonrpc:"2.0",method:$m}')"
    fi
}

oam_request() {
    local method=$1 params=${2:-'{}'} id kind rc
    [ -n "${OAM_DIR:-}" ] || { echo "oam.sh: no bridge: call oam_start first" >&2; return 1; }
    id=$(( $(cat "$OAM_DIR/id") + 1 )); echo "$id" >"$OAM_DIR/id"
    if ! _oam_send "$(jq -cn --arg m "$method" --argjson p "$params" --argjson id "$id" \
        '{jsonrpc:"2.0",id:$id,method:$m,params:$p}')"; then
        OAM_ERROR='{"code":-32603,"message":"bridge not running","data":{"code":"transport"}}'
        echo "$OAM_ERROR"; return 1
    fi
    while :; do
        _oam_read; rc=$?
        if [ $rc -ne 0 ]; then
            if [ $rc -eq 2 ]; then _oam_gone "$method: no answer"
            else echo "oam.sh: $method: no answer within ${OAM_TIMEOUT}s" >&2; fi
            OAM_ERROR='{"code":-32603,"message":"bridge closed or timed out","data":{"code":"transport"}}'
            echo "$OAM_ERROR"; return 1
        fi
        kind=$(jq -r --argjson id "$id" \
            'if has("method") and (has("id")|not) then "event"
             elif .id == $id then (if has("error") then "error" else "result" end)
             else "other" end' <<<"$_OAM_LINE")
        case $kind in
            event) printf '%s\n' "$_OAM_LINE" >>"$OAM_DIR/events" ;;
            result) OAM_RESULT=$(jq -c '.result' <<<"$_OAM_LINE"); echo "$OAM_RESULT"; return 0 ;;
            error) OAM_ERROR=$(jq -c '.error' <<<"$_OAM_LINE"); echo "$OAM_ERROR"; return 1 ;;
            *) echo "oam.sh: unexpected line: $_OAM_LINE" >&2 ;;
        esac
    done
}

oam_next_event() {
    local t=${1:-$OAM_TIMEOUT} first
    if [ -s "$OAM_DIR/events" ]; then
        IFS= read -r first <"$OAM_DIR/events"
        sed -i 1d "$OAM_DIR/events"
        printf '%s\n' "$first"; return 0
    fi
    while :; do
        _oam_read "$t" || return $?
        if jq -e 'has("method") and (has("id")|not)' <<<"$_OAM_LINE" >/dev/null; then
            printf '%s\n' "$_OAM_LINE"; return 0
        fi
        echo "oam.sh: unexpected line: $_OAM_LINE" >&2
    done
}

# _oam_call METHOD JQ_ARGS... : builds the params with `jq -cn JQ_ARGS...`, then oam_request.
# An argument that is not JSON is refused here, with an error object like the bridge's.
_oam_call() {
    local method=$1 params; shift
    if ! params=$(jq -cn "$@" 2>/dev/null); then
        echo "oam.sh: $method: an argument that should be JSON is not" >&2
        OAM_ERROR=$(jq -cn --arg m "$method: an argument that should be JSON is not" \
            '{code:-32602,message:$m,data:{code:"invalid_params"}}')
        echo "$OAM_ERROR"; return 1
    fi
    oam_request "$method" "$params"
}

oam_respond() {
    _oam_call npc/respond --arg n "$1" --arg p "$2" --argjson x "${3:-"{}"}" \
        '{npcId:$n,prompt:$p} + $x'
}

oam_decide() {
    _oam_call npc/decide --arg n "$1" --arg s "$2" --argjson o "$3" --argjson x "${4:-"{}"}" \
        '{npcId:$n,situation:$s,options:$o} + $x'
}

oam_prewarm() {
    _oam_call npc/prewarm --arg n "$1" --arg s "${2:-}" --arg p "${3:-}" \
        '{npcId:$n} + (if $s == "" then {} else {speaker:$s} end)
         + (if $p == "" then {} else {promptPrefix:$p} end)'
}

oam_set_tags() {
    local npc=$1; shift
    _oam_call npc/setTags --arg n "$npc" '{npcId:$n,tags:$ARGS.positional}' --args "$@"
}

oam_world_set() {
    _oam_call world/set --arg k "$1" --argjson v "$2" --argjson x "${3:-"{}"}" '{key:$k,value:$v} + $x'
}

oam_world_delete() {
    _oam_call world/delete --arg k "$1" '{key:$k}'
}

oam_world_get() {
    if [ $# -gt 0 ]; then _oam_call world/get --arg n "$1" '{npcId:$n}'
    else oam_request world/get '{}'; fi
}

oam_wait_turn() {
    local tid=$1 t=${2:-$OAM_TIMEOUT} ev rc=2 others=() kind
    while ev=$(oam_next_event "$t"); do
        kind=$(jq -r --arg t "$tid" 'if .params.turnId != $t then "other" else .method end' <<<"$ev")
        case $kind in
            other) others+=("$ev") ;;
            turn/completed) rc=0; break ;;
            turn/failed) rc=1; break ;;
        esac
    done
    if [ ${#others[@]} -gt 0 ]; then  # put other turns' events back, in order, at the front
        { printf '%s\n' "${others[@]}"; cat "$OAM_DIR/events"; } >"$OAM_DIR/events.new"
        mv "$OAM_DIR/events.new" "$OAM_DIR/events"
    fi
    [ $rc -eq 2 ] && { echo "oam.sh: turn $tid: no terminal event within ${t}s" >&2; return 2; }
    printf '%s\n' "$ev"; return $rc
}

oam_stop() {
    local rc
    oam_request shutdown '{}' >/dev/null || true
    oam_notify exit
    exec {OAM_TO}>&-
    wait "$OAM_PID"; rc=$?
    exec {OAM_FROM}<&-
    rm -rf "$OAM_DIR"
    return $rc
}
