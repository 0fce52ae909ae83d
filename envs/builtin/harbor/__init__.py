"""Harbor-format tasks: loading task directories (`.task`) and running their verifier (`.verifier`)."""
