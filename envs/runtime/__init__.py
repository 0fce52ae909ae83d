"""Runtimes: where a rollout's tool servers and commands run (envs.runtime.base has the interface)."""
