"""The Python SDK: clients, groups, sessions, evals, datasets and the trainer contract."""
