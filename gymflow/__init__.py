"""gymflow: RL environments for tool-using LLMs, where every rollout is a durable Temporal workflow."""
