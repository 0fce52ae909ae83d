#!/bin/bash
mkdir -p /logs/verifier
ok=1
[ -x /app/bin/greet ] && [ "$(/app/bin/greet)" = "hello from greet" ] || ok=0
echo "40aff2e9d2d8922e47afd4648e6967497158785fbd1da870e7110266bf944880  /app/data/table.bin" | sha256sum -c --quiet || ok=0
[ "$(cat /app/data/note.txt)" = "no newline at the end" ] && [ "$(wc -c < /app/data/note.txt)" -eq 21 ] || ok=0
echo $ok > /logs/verifier/reward.txt
