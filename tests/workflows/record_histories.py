"""Record workflow histories for the replay tests: `python tests/workflows/record_histories.py`.

Run it after an intentional change to workflow code (and say so in the commit): the replay test
then proves that histories written by the new code replay, while the old files it replaced would
have shown the change was not backwards compatible.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

# The project root first, so the real packages win over the tests/ folders that mirror them.
sys.path[:0] = [str(Path(__file__).parents[2])]
sys.path.append(str(Path(__file__).parents[1]))

from activities.model import ModelConfig  # noqa: E402
from envs.contract import Message, Task  # noqa: E402
from envs.math.data import generate_tasks  # noqa: E402
from envs.math.policy import CalculatorPolicy  # noqa: E402
from support import ScriptedPolicy, call, make_settings  # noqa: E402
from workers.client import DATA_CONVERTER, start_rollout  # noqa: E402
from workers.policy_server import PolicyServer  # noqa: E402
from workers.server import temporal_binary  # noqa: E402
from workers.worker import running_worker  # noqa: E402
from workflows.group import BatchRolloutWorkflow, GroupRolloutWorkflow  # noqa: E402
from workflows.names import SEARCH_ATTRIBUTES  # noqa: E402
from workflows.schema import BatchInput, GroupInput, RetrySettings, RolloutInput, RolloutOptions  # noqa: E402

OUT = Path(__file__).parent / "histories"


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES, data_converter=DATA_CONVERTER
    )
    client = env.client
    with tempfile.TemporaryDirectory() as tmp:
        settings = make_settings(Path(tmp))
        async with running_worker(client, settings), PolicyServer(CalculatorPolicy()) as calc:
            bad = ScriptedPolicy(
                [
                    Message(role="assistant", tool_calls=[call("add", raw='{"a": 1,')]),
                    Message(role="assistant", tool_calls=[call("nope", {})]),
                    Message(role="assistant", tool_calls=[call("divide", {"a": 1, "b": 0})]),
                    Message(role="assistant", content="<answer>1</answer>"),
                ]
            )
            async with PolicyServer(bad) as bad_server:
                cases = {
                    "math_solved": RolloutInput(
                        env="math", task=generate_tasks(1, seed=1, difficulty=3)[0],
                        model=ModelConfig(base_url=calc.url),
                    ),
                    "math_bad_model_output": RolloutInput(
                        env="math", task=Task(id="t", prompt="p", ground_truth="1"),
                        model=ModelConfig(base_url=bad_server.url),
                    ),
                    "math_model_down": RolloutInput(
                        env="math", task=Task(id="t", prompt="p", ground_truth="1"),
                        model=ModelConfig(base_url="http://127.0.0.1:9/v1"), retry=RetrySettings(model_attempts=2),
                    ),
                }  # fmt: skip
                for name, item in cases.items():
                    handle = await start_rollout(client, item, task_queue=settings.task_queue, workflow_id=name)
                    await handle.result()
                    history = await handle.fetch_history()
                    (OUT / f"{name}.json").write_text(history.to_json())
                    print("recorded", name)
            await record_parents(client, settings.task_queue, calc.url)
    await env.shutdown()


async def record_parents(client: Client, task_queue: str, url: str) -> None:
    """A GRPO group and the first run of a batch that continues as new (files are named after
    the workflow id: replay derives child ids from it)."""
    model = ModelConfig(base_url=url)
    task = generate_tasks(1, seed=2)[0]
    group = await client.start_workflow(
        GroupRolloutWorkflow.run,
        GroupInput(rollout=RolloutInput(env="math-inproc", task=task, model=model), n=2),
        id="group_math",
        task_queue=task_queue,
    )
    batch = await client.start_workflow(
        BatchRolloutWorkflow.run,
        BatchInput(
            env="math-inproc",
            tasks=generate_tasks(3, seed=4),
            options=RolloutOptions(model=model),
            window=2,
            max_children_per_run=2,
        ),
        id="batch_math",
        task_queue=task_queue,
    )
    await group.result()
    await batch.result()
    for name, handle in {"group_math": group, "batch_math": batch}.items():
        run = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        (OUT / f"{name}.json").write_text((await run.fetch_history()).to_json())
        print("recorded", name)


if __name__ == "__main__":
    asyncio.run(main())
