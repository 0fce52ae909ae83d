"""The MCP env kind: per-rollout MCP server processes (`McpEnv`), their warm pool, sessions and rewards,
and the ledger a new worker reaps orphans by."""
