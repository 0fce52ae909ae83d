"""GRPO groups of the math env: n samples per task, with group-relative advantages."""

import gymflow


async def main() -> None:
    settings = gymflow.Settings()
    client = await gymflow.connect(settings.temporal_address)
    options = gymflow.RolloutOptions(model=gymflow.ModelConfig(base_url=settings.model_url))
    tasks = gymflow.env_class("math").load_dataset("generated", n=2, seed=0)
    async for group in gymflow.iterate_groups(
        client, "math", tasks, n=2, options=options, task_queue=settings.task_queue
    ):
        print(group.task_id, "mean reward", group.mean_reward, "infra-failed", group.infra_failed)
        for trajectory, advantage in zip(group.trajectories, group.advantages, strict=True):
            print("  ", trajectory.rollout_id, trajectory.reward and trajectory.reward.total, advantage)


if __name__ == "__main__":
    gymflow.run(main())  # asyncio.run, then an exit the SDK's threads cannot crash
