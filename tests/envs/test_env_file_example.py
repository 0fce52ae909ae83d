"""envs/examples/calculator.yaml (shown in the README) runs real rollouts by its path."""

from __future__ import annotations

from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.registry import env_class
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.worker import RunningWorker

EXAMPLE = "envs/examples/calculator.yaml"  # relative: the worker resolves it from its cwd, like the CLI


async def test_calculator_env_file(client: Client, worker: RunningWorker, calculator_policy_url: str) -> None:
    tasks = list(env_class(EXAMPLE).load_dataset("default"))
    assert len(tasks) == 4
    for task in tasks[:2]:
        result = await run_rollout(
            client,
            RolloutInput(env=EXAMPLE, task=task, model=ModelConfig(base_url=calculator_policy_url)),
            task_queue=worker.task_queue,
        )
        assert result.reward is not None and result.reward.components == {"correct": 1.0}, result
        assert result.tool_calls >= 1 and result.env == EXAMPLE


def test_readme_shows_the_env_file_verbatim() -> None:
    from pathlib import Path

    root = Path(__file__).parents[2]
    source = (root / EXAMPLE).read_text()
    assert f"```yaml\n{source}```" in (root / "README.md").read_text()
