"""Record workflow histories for the replay tests: `python tests/workflows/record_histories.py [NAME ...]`.

`... record_histories.py session` records only the named groups (rollouts, parents, dataset, session).
Run it after an intentional change to workflow code (and say so in the commit): the replay test
then proves that histories written by the new code replay, while the old files it replaced would
have shown the change was not backwards compatible. With names, only those histories are
(re)recorded, so the files older code wrote stay as they are.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

# The project root first, so the real packages win over the tests/ folders that mirror them.
sys.path[:0] = [str(Path(__file__).parents[2])]
sys.path.append(str(Path(__file__).parents[1]))

from gymflow.activities.dataset_models import DatasetSource  # noqa: E402
from gymflow.activities.model import ModelConfig  # noqa: E402
from gymflow.activities.names import SEARCH_ATTRIBUTES, dataset_queue  # noqa: E402
from gymflow.activities.rescore import RescoreInput  # noqa: E402
from gymflow.activities.schema import (  # noqa: E402
    BatchInput,
    BatchResult,
    DatasetInput,
    GroupInput,
    RetrySettings,
    RolloutInput,
    RolloutOptions,
)
from gymflow.activities.session_schema import SessionInput  # noqa: E402
from gymflow.envs.builtin.math.data import generate_tasks  # noqa: E402
from gymflow.envs.builtin.math.policy import CalculatorPolicy  # noqa: E402
from gymflow.envs.contract import Message, Task  # noqa: E402
from gymflow.workers.client import DATA_CONVERTER  # noqa: E402
from gymflow.workers.sdk.client import start_rollout  # noqa: E402
from gymflow.workers.sdk.sessions import start_session  # noqa: E402
from gymflow.workers.servers.policy import PolicyServer  # noqa: E402
from gymflow.workers.servers.temporal import temporal_binary  # noqa: E402
from gymflow.workers.worker import running_worker  # noqa: E402
from gymflow.workflows.dataset import DatasetGenerationWorkflow  # noqa: E402
from gymflow.workflows.group import BatchRolloutWorkflow, GroupRolloutWorkflow  # noqa: E402
from gymflow.workflows.rescore import RescoreBatchWorkflow  # noqa: E402
from support import ScriptedPolicy, call, make_settings  # noqa: E402

OUT = Path(__file__).parent / "histories"


async def main(only: set[str]) -> None:
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
                        model=ModelConfig(base_url=calc.url), fuse_turns=False,
                    ),
                    "math_bad_model_output": RolloutInput(
                        env="math", task=Task(id="t", prompt="p", ground_truth="1"),
                        model=ModelConfig(base_url=bad_server.url), fuse_turns=False,
                    ),
                    "math_fused": RolloutInput(  # the classic ones above say fuse_turns=False when re-recorded
                        env="math", task=generate_tasks(1, seed=1, difficulty=3)[0],
                        model=ModelConfig(base_url=calc.url), fuse_turns=True,
                    ),
                    "math_fused_call_lines": RolloutInput(  # math_fused as written once results had call lines
                        env="math", task=generate_tasks(1, seed=1, difficulty=3)[0],
                        model=ModelConfig(base_url=calc.url), fuse_turns=True,
                    ),
                    "math_fused_bad_model_output": RolloutInput(
                        env="math", task=Task(id="t", prompt="p", ground_truth="1"),
                        model=ModelConfig(base_url=bad_server.url), fuse_turns=True,
                    ),
                    "math_model_down": RolloutInput(
                        env="math", task=Task(id="t", prompt="p", ground_truth="1"),
                        model=ModelConfig(base_url="http://127.0.0.1:9/v1"), retry=RetrySettings(model_attempts=2),
                    ),
                }  # fmt: skip
                for name, item in cases.items():
                    if only and "rollouts" not in only and name not in only:
                        continue
                    handle = await start_rollout(client, item, task_queue=settings.task_queue, workflow_id=name)
                    await handle.result()
                    history = await handle.fetch_history()
                    (OUT / f"{name}.json").write_text(history.to_json())
                    print("recorded", name)
            if (
                not only
                or "parents" in only
                or only & {"batch_report", "math_plain_start", "batch_resume", "rescore_math"}
            ):
                await record_parents(client, settings.task_queue, calc.url, only - {"parents"})
            if not only or "dataset" in only:
                await record_dataset(client, settings.task_queue, Path(tmp))
            if not only or "session" in only:
                await record_session(client, settings.task_queue)
    await env.shutdown()


async def record_parents(client: Client, task_queue: str, url: str, only: set[str]) -> None:
    """A GRPO group, the first run of a batch that continues as new, a batch that ends (with its
    report) and a rollout started without search attributes, as `temporal workflow start` does
    (files are named after the workflow id: replay derives child ids from it)."""
    model = ModelConfig(base_url=url)
    task = generate_tasks(1, seed=2)[0]
    if only:
        await record_new(client, task_queue, model, only)
        return
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


async def record_dataset(client: Client, task_queue: str, tmp: Path) -> None:
    """Both runs of an offline dataset generation that continues as new once (merge, cancel, finalize)."""
    sample = Path(__file__).parents[2] / "envs" / "builtin" / "search" / "sample_corpus"
    handle = await client.start_workflow(
        DatasetGenerationWorkflow.run,
        DatasetInput(
            source=DatasetSource(kind="corpus", location=str(sample)), n=12, out=str(tmp / "ds"),
            batch_size=8, window=2, max_batches_per_run=2,
        ),
        id="dataset_offline",
        task_queue=dataset_queue(task_queue),
    )  # fmt: skip
    await handle.result()
    first = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    (OUT / "dataset_offline.json").write_text((await first.fetch_history()).to_json())
    (OUT / "dataset_offline_run2.json").write_text(
        (await client.get_workflow_handle(handle.id).fetch_history()).to_json()
    )
    print("recorded dataset_offline")


async def record_session(client: Client, task_queue: str) -> None:
    """A trainer-driven math session: reset, a tool step, a wrong tool name, the answer."""
    task = Task(id="add", prompt="What is 2 + 3?", ground_truth="5")
    session = await start_session(
        client, SessionInput(env="math", task=task), task_queue=task_queue, workflow_id="session_math"
    )
    await session.reset()
    await session.step(text='<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
    await session.step(Message(role="assistant", tool_calls=[call("nope", {})]))
    await session.step(text="<answer>5</answer>")
    await session.close()
    (OUT / "session_math.json").write_text((await session.handle.fetch_history()).to_json())
    print("recorded session_math")


async def record_new(client: Client, task_queue: str, model: ModelConfig, only: set[str]) -> None:
    handles = {}
    if "batch_report" in only:
        handles["batch_report"] = await client.start_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(env="math-inproc", tasks=generate_tasks(2, seed=5), options=RolloutOptions(model=model)),
            id="batch_report",
            task_queue=task_queue,
        )
    if "math_plain_start" in only:  # no search attributes, no memo: the workflow sets them
        rollout = RolloutInput(env="math-inproc", task=generate_tasks(1, seed=6)[0], model=model)
        handles["math_plain_start"] = await client.start_workflow(
            "RolloutWorkflow", rollout, id="math_plain_start", task_queue=task_queue
        )
    if "batch_resume" in only:  # a batch stopped after its first rollout, resumed by another
        handles["batch_resume"] = await record_resumed(client, task_queue, model)
    if "rescore_math" in only:  # a finished batch rescored with the env's reward by name
        source = await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(env="math-inproc", tasks=generate_tasks(3, seed=8), options=RolloutOptions(model=model),
                       flush_bytes=1024),  # a part per rollout: several rescore_part activities
            id="rescore_source",
            task_queue=task_queue,
        )  # fmt: skip
        handles["rescore_math"] = await client.start_workflow(
            RescoreBatchWorkflow.run,
            RescoreInput(source=source.batch_id, reward="math-inproc", window=2),
            id="rescore_math",
            task_queue=task_queue,
        )
    for name, handle in handles.items():
        await handle.result()
        (OUT / f"{name}.json").write_text((await handle.fetch_history()).to_json())
        print("recorded", name)


async def record_resumed(client: Client, task_queue: str, model: ModelConfig) -> WorkflowHandle[Any, BatchResult]:
    tasks = generate_tasks(3, seed=7)
    source = await client.start_workflow(
        BatchRolloutWorkflow.run,
        BatchInput(env="math-inproc", tasks=tasks, options=RolloutOptions(model=model), window=1),
        id="batch_resume_source",
        task_queue=task_queue,
    )
    for _ in range(600):  # a minute at most
        if (await source.query(BatchRolloutWorkflow.progress))["completed"] >= 1:
            break
        await asyncio.sleep(0.1)
    return await client.start_workflow(
        BatchRolloutWorkflow.run,
        BatchInput(env="math-inproc", tasks=tasks, options=RolloutOptions(model=model), resumed_from=source.id),
        id="batch_resume",
        task_queue=task_queue,
    )


if __name__ == "__main__":
    asyncio.run(main(set(sys.argv[1:])))
