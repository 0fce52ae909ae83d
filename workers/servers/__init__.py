"""HTTP servers a node runs (policy, codec, model gateway) and the embedded Temporal server."""
