#!/bin/sh
# A minimal MCP stdio server in POSIX sh (the image has no Python): one tool, `whereami`, that says
# where it runs. Enough to show any stdio MCP server runs inside a rollout's container.
field() { printf '%s' "$1" | sed -n "s/.*\"$2\": *\"\{0,1\}\([^\",}]*\).*/\1/p"; }
while IFS= read -r line; do
  id=$(field "$line" id)
  case $(field "$line" method) in
    initialize)
      version=$(field "$line" protocolVersion)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"%s","capabilities":{"tools":{}},"serverInfo":{"name":"sh","version":"1"}}}\n' "$id" "$version" ;;
    tools/list)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"whereami","description":"where this server runs","inputSchema":{"type":"object","properties":{}}}]}}\n' "$id" ;;
    tools/call)
      text="host=$(hostname) marker=$(cat /etc/gymflow-marker) greeting=${GREETING:-none} cwd=$(pwd) files=$(ls /workspace | tr '\n' ',')"
      printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}],"isError":false}}\n' "$id" "$text" ;;
    ping)
      printf '{"jsonrpc":"2.0","id":%s,"result":{}}\n' "$id" ;;
    notifications/*) ;;
    *)  # any other request: "method not found", at once (a client may probe before it initializes)
      [ -n "$id" ] && printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"method not found"}}\n' "$id" ;;
  esac
done
