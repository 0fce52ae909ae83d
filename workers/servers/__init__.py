"""HTTP servers a node runs (policy, codec) and the embedded Temporal server."""
