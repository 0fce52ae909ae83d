"""The Python SDK: rollouts, groups, sessions, evals, datasets, the trainer contract, and the
OpenEnv-protocol exporter built on sessions."""
