#!/bin/bash
# Asks this rollout's db for its token and compares it with what the agent wrote.
exec 3<>/dev/tcp/db/7000 || { echo "db unreachable" >&2; exit 1; }
read -r token <&3
if [ -f /app/token.txt ] && [ "$(cat /app/token.txt)" = "$token" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
