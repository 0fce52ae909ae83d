"""Harbor-format tasks: loading task directories (envs.harbor.task) and running their verifier (envs.harbor.verifier)."""
