from gymflow.activities.model import ModelConfig
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.workers.sdk.groups import GymflowClient


async def train_on_groups(address: str, model_url: str, *, task_queue: str = "gymflow") -> int:
    """Stream GRPO groups with token data; returns how many samples a trainer would use."""
    client = await GymflowClient.connect(address, env="math", task_queue=task_queue)
    model = ModelConfig(base_url=model_url, tokens="vllm")  # or "sglang"
    used = 0
    tasks = generate_tasks(4, seed=0)
    async for group in client.rollout_groups(tasks, n=8, model=model, batch_id="step-0", max_in_flight=2):
        for trajectory, advantage in zip(group.trajectories, group.advantages, strict=True):
            if advantage is None:  # infra-failed sample: drop it, never train on it as reward 0
                continue
            sequence = trajectory.token_sequence()  # ids, loss_mask (1 = model tokens), logprobs
            used += len(sequence.ids) > 0
    return used
