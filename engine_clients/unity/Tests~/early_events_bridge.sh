#!/bin/sh
# A fake bridge for ScenarioTest: answers the first request (an npc/respond, id 1) only after
# writing that turn's events, to check that the client still hands them to the Turn.
read -r request
echo '{"jsonrpc":"2.0","method":"turn/started","params":{"prompt":"hi","npcId":"x","turnId":"t1","seq":0}}'
echo '{"jsonrpc":"2.0","method":"turn/textDelta","params":{"delta":"early","text":"early","isReset":false,"npcId":"x","turnId":"t1","seq":1}}'
echo '{"jsonrpc":"2.0","method":"turn/completed","params":{"npcId":"x","turnId":"t1","seq":2,"text":"early","json":null,"toolCalls":[],"usage":{"inputTokens":1,"outputTokens":1,"cachedTokens":0},"steps":1,"finishReason":"stop","warnings":[]}}'
echo '{"jsonrpc":"2.0","id":1,"result":{"npcId":"x","turnId":"t1"}}'
cat >/dev/null   # until stdin closes
