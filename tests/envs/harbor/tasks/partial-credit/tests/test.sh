#!/bin/bash
mkdir -p /logs/verifier
ok=0
for pair in a:alpha b:beta c:gamma d:delta; do
  [ "$(cat /app/${pair%%:*}.txt 2>/dev/null)" = "${pair#*:}" ] && ok=$((ok + 1))
done
printf '{"reward": %s, "files_ok": %d, "files_total": 4, "note": "one point per file"}\n' "$(echo "scale=2; $ok / 4" | bc 2>/dev/null || awk "BEGIN{print $ok/4}")" "$ok" > /logs/verifier/reward.json
