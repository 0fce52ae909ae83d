#!/bin/bash
set -euo pipefail
exec 3<>/dev/tcp/db/7000
read -r token <&3
printf '%s' "$token" > /app/token.txt
echo "wrote the token"
