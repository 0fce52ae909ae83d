"""Harness envs: an unmodified agent program plays the rollout, its model calls through the gateway."""
