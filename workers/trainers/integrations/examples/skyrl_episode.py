import skyrl_gym

from gymflow.envs.contract import Task
from gymflow.workers.trainers.integrations.skyrl import (
    dataset_row,  # importing it registers gymflow-math, gymflow-sheets
)


def skyrl_episode(address: str, *, task_queue: str = "gymflow") -> float:
    """One episode as SkyRL's generator plays it (synchronously, from a worker thread)."""
    row = dataset_row("math", Task(id="add-2-3", prompt="What is 2 + 3?", ground_truth="5"))
    config = {"temporal_address": address, "task_queue": task_queue}  # environment.skyrl_gym.gymflow-math
    env = skyrl_gym.make(row["env_class"], env_config=config, extras=row)
    prompt, _ = env.init(row["prompt"])  # the system prompt with the tools (hermes), then the task
    assert prompt[0]["role"] == "system" and "<tools>" in prompt[0]["content"]
    output = env.step('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
    assert "<tool_response>\n5\n</tool_response>" in output["observations"][0]["content"]
    output = env.step("<answer>5</answer>")
    env.close()
    assert output["done"]
    return output["reward"]
