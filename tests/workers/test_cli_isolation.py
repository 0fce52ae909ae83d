"""Two CLI commands run side by side never run, or print, each other's workflows.

Three `gymflow` commands as three terminals would run them, with the same shared task queue: a
rollout batch held in its model turns (so its in-process worker is polling the whole time), a
second rollout batch, and a dataset generation that fails (a missing corpus). Every workflow they
started is served only by the process that started it (the worker identity on every workflow and
activity task in its history is that process's), each command polls a queue of its own, and no
command's output names another's workflows: the failure shows in the dataset command alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.client import Client

from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.servers.policy import AppServer
from support import SlowModel

ROOT = Path(__file__).parents[2]
SERVED_EVENTS = ("workflow_task_started_event_attributes", "activity_task_started_event_attributes")
"""History events whose `identity` is the worker that took the task."""


async def start(args: list[str], *, cwd: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gymflow.workers.cli", *args, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def finish(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(process.communicate(), 100)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def served_by(client: Client, workflow_id: str) -> set[str]:
    """The identities of the workers that took this workflow's tasks."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return {getattr(e, a).identity for e in history.events for a in SERVED_EVENTS if e.HasField(a)}


@pytest.mark.heavy
async def test_parallel_commands_never_run_or_print_each_others_workflows(
    client: Client, temporal_address: str, tmp_path: Path
) -> None:
    shared = f"iso-{uuid.uuid4().hex[:8]}"  # what both terminals' GYMFLOW_TASK_QUEUE says
    env = {"GYMFLOW_TASK_QUEUE": shared, "GYMFLOW_DATA_DIR": str(tmp_path / "data"), "GYMFLOW_MCP_POOL_SIZE": "0"}
    common = ["--address", temporal_address, "--json"]
    since = datetime.now(UTC)
    held = SlowModel(CalculatorPolicy())
    async with AppServer(held) as model:
        first = await start(["rollout", "math", "--n", "3", "--model-url", model.url, *common], cwd=tmp_path, env=env)
        try:
            while held.waiting < 3:  # all of the first command's rollouts wait in a model turn
                assert first.returncode is None, (await finish(first))[2][-3000:]
                await asyncio.sleep(0.1)
            second = await start(["rollout", "math", "--n", "3", "--seed", "7", *common], cwd=tmp_path, env=env)
            missing = tmp_path / "no-corpus"
            third = await start(
                ["dataset", "generate", "--source", f"corpus:{missing}", "--n", "3", *common], cwd=tmp_path, env=env
            )
            second_code, second_out, second_err = await finish(second)
            third_code, _, third_err = await finish(third)
        finally:
            held.release.set()
        first_code, first_out, first_err = await finish(first)
    assert first_code == 0 and second_code == 0, (first_err[-2000:], second_err[-2000:])
    assert third_code == 2 and "does not exist" in third_err.strip().splitlines()[-1], third_err[-2000:]

    processes = {"first": first.pid, "second": second.pid, "third": third.pid}
    outputs = {"first": first_out + first_err, "second": second_out + second_err, "third": third_err}
    rollouts = {
        "first": {r["workflow_id"] for r in json.loads(first_out)["rollouts"]},
        "second": {r["workflow_id"] for r in json.loads(second_out)["rollouts"]},
    }
    started: dict[str, set[str]] = {name: set() for name in processes}
    queues: dict[str, set[str]] = {name: set() for name in processes}
    async for execution in client.list_workflows(f'StartTime >= "{since.isoformat()}"'):
        if execution.task_queue != shared and not execution.task_queue.startswith(f"{shared}-"):
            continue  # another test's
        history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        starter = history.events[0].workflow_execution_started_event_attributes.identity
        owner = next(name for name, pid in processes.items() if starter.startswith(f"{pid}@"))
        started[owner].add(execution.id)
        queues[owner].add(execution.task_queue)
        served = await served_by(client, execution.id)
        assert served == {starter}, f"{execution.id} (started by the {owner} command) was served by {served}"
    assert started["first"] == rollouts["first"] and started["second"] == rollouts["second"]
    assert len(started["third"]) == 1 and all(len(q) == 1 for q in queues.values())
    assert len(set.union(*queues.values()) - {shared}) == 3  # a queue per command, none of them the shared one
    for name, output in outputs.items():
        for other, ids in started.items():
            if other != name:
                assert not any(i in output for i in ids), f"the {name} command printed the {other} command's workflows"
    assert "no-corpus" not in outputs["first"] + outputs["second"]
