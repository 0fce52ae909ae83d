"""One rollout from Python: the address, task queue and model URL come from GYMFLOW_* variables."""

import gymflow


async def main() -> None:
    settings = gymflow.Settings()  # GYMFLOW_TEMPORAL_ADDRESS (localhost:7233), GYMFLOW_TASK_QUEUE (gymflow)
    client = await gymflow.connect(settings.temporal_address)
    task = gymflow.Task(id="product", prompt="Compute the value of the expression: 12 * 7", ground_truth="84")
    model = gymflow.ModelConfig(base_url=settings.model_url or "http://127.0.0.1:8000/v1")
    rollout = gymflow.RolloutInput(env="math", task=task, model=model)
    result = await gymflow.run_rollout(client, rollout, task_queue=settings.task_queue)
    print(result.termination, result.reward, f"{result.turns} turns, {result.tool_calls} tool calls")
    assert not result.infra_failed and result.reward is not None


if __name__ == "__main__":
    gymflow.run(main())  # asyncio.run, then an exit the SDK's threads cannot crash
