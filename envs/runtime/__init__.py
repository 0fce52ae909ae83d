"""Runtimes: where a rollout's tool servers and commands run (gymflow.envs.runtime.base has the interface)."""
