"""Harbor-format tasks: loading task directories (envs.harbor.task), running their verifier (envs.harbor.verifier)."""
