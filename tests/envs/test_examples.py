"""The README's "an environment in 30 lines" is this file, and it runs as a real rollout."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.contract import Message
from gymflow.envs.examples.units import UnitsEnv
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call

ROOT = Path(__file__).parents[2]


def test_readme_shows_the_example_verbatim() -> None:
    source = (ROOT / "envs" / "examples" / "units.py").read_text()
    assert f"```python\n{source}```" in (ROOT / "README.md").read_text()
    assert len(source.splitlines()) <= 30


async def test_units_env_rollout(client: Client, worker: RunningWorker) -> None:
    task = UnitsEnv.load_dataset("default")[1]
    miles = float(task.id.removeprefix("miles-"))
    policy = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("multiply", {"a": miles, "b": 1.609344})]),
            Message(role="assistant", content=f"<answer>{miles * 1.609344:.4f}</answer>"),
        ]
    )
    async with PolicyServer(policy) as server:
        result = await run_rollout(
            client, RolloutInput(env="units", task=task, model=ModelConfig(base_url=server.url)),
            task_queue=worker.task_queue,
        )  # fmt: skip
    assert result.reward is not None and result.reward.total == 1.0
    (observation,) = [m for m in result.messages if m.role == "tool"]
    assert not observation.is_error and abs(float(observation.content) - miles * 1.609344) < 1e-6
