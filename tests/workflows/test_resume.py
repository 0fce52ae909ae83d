"""Resuming a batch whose worker died (`gymflow eval ENV --resume BATCH`, `EvalOptions.resume`).

A batch runs on a real worker process, which is killed (-9) while some of its rollouts are in
flight, after some finished and some failed (their verifier crashed in that process). Resuming it
runs exactly the rollouts that had not finished or were infra-failed (the model endpoint answers
only those), carries the others over, takes the dead batch and its open rollouts down, and reports
the same counts and statistics as an uninterrupted run of the same eval.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import figures
import pytest
from batch_support import FAILING_TASKS, MentalMathPolicy, TransientMathEnv
from mcp_support import eventually, wait_polling
from starlette.types import Receive, Scope, Send
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import TypedSearchAttributes

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, BatchResult, RolloutOptions, batch_search_attributes
from gymflow.activities.storage import read_trajectories
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Trajectory
from gymflow.envs.policy import Policy
from gymflow.workers.sdk.evals import EvalOptions, run_eval
from gymflow.workers.servers.policy import AppServer, PolicyServer, build_app
from gymflow.workflows.group import BatchRolloutWorkflow
from support import WEB_UI_PORT, make_settings

TESTS = Path(__file__).parents[1]
TASKS, SAMPLES, SEED = 8, 2, 5
ANSWER = 6
"""Model calls the first worker gets answered; later ones are held until it is dead."""


class Gate:
    """A policy endpoint (ASGI) that answers the first `answer` completions and holds the rest."""

    def __init__(self, policy: Policy, *, answer: int) -> None:
        self.app = build_app(policy)
        self.answer = answer
        self.answered = 0
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            if self.answered >= self.answer:
                self.holding.set()
                await self.release.wait()
            else:
                self.answered += 1
        await self.app(scope, receive, send)


def start_worker(tmp_path: Path, address: str, queue: str, failing: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "GYMFLOW_TEMPORAL_ADDRESS": address,
        "GYMFLOW_TASK_QUEUE": queue,
        "GYMFLOW_NODE_ID": f"node-{uuid.uuid4().hex[:6]}",
        "GYMFLOW_DATA_DIR": str(tmp_path / "worker"),
        "GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
        "GYMFLOW_MCP_POOL_SIZE": "0",
        "GYMFLOW_WORKER_ROLES": "rollout",
        "GYMFLOW_UI_PORT": str(WEB_UI_PORT),
        FAILING_TASKS: failing,
    }
    log = (tmp_path / "worker.log").open("ab")
    try:
        return subprocess.Popen([sys.executable, str(TESTS / "batch_worker.py")], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    finally:
        log.close()


def indices(trajectories: list[Trajectory], batch_id: str) -> set[int]:
    prefix = f"{batch_id}/r"
    return {int(t.rollout_id.removeprefix(prefix)) for t in trajectories if t.rollout_id.startswith(prefix)}


def side(summary: dict[str, Any]) -> tuple[Any, ...]:
    """What an eval reports of its policy: counts, mean, pass@k and the per-task rows."""
    policy = summary["policy"]
    rows = [(r["task_id"], r["rollouts"], r["completed"], r["infra_failed"], r["mean"]) for r in summary["per_task"]]
    return policy["rollouts"], policy["completed"], policy["infra_failed"], policy["mean"]["value"], sorted(rows)


@pytest.mark.heavy
async def test_resume_after_kill_9_of_the_worker(client: Client, temporal_address: str, tmp_path: Path) -> None:
    tasks = generate_tasks(TASKS, seed=SEED, difficulty=1)
    rollouts = TASKS * SAMPLES
    queue = f"resume-{uuid.uuid4().hex[:8]}"
    gate = Gate(MentalMathPolicy(), answer=ANSWER)
    async with AppServer(gate) as endpoint:
        worker = start_worker(tmp_path, temporal_address, queue, failing=tasks[0].id)  # r0, r1: infra-failed
        try:
            await wait_polling(client, [queue])
            batch = BatchInput(
                env=TransientMathEnv.name,
                dataset="generated",
                dataset_options={"n": TASKS, "seed": SEED},
                num_tasks=TASKS,
                samples_per_task=SAMPLES,
                options=RolloutOptions(model=ModelConfig(base_url=endpoint.url, model="mental")),
                window=4,
                label="mental",
            )
            old_id = f"eval-resume-{uuid.uuid4().hex[:8]}"
            attributes = TypedSearchAttributes(batch_search_attributes(batch, old_id))
            old = await client.start_workflow(
                BatchRolloutWorkflow.run, batch, id=old_id, task_queue=queue, search_attributes=attributes
            )
            await asyncio.wait_for(gate.holding.wait(), timeout=120)  # rollouts in flight
            progress = await eventually(  # and every rollout answered has finished
                lambda: old.query(BatchRolloutWorkflow.progress), lambda p: p["completed"] == ANSWER, timeout_s=60
            )
            assert progress["completed"] == ANSWER and progress["in_flight"]
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=30)
            gate.release.set()  # the held calls answer a dead worker
    failed_before = await client.get_workflow_handle(f"{old_id}/r0", result_type=Trajectory).result()
    assert failed_before.infra_failed  # the killed run had an infra failure to redo

    settings = make_settings(tmp_path / "resume", temporal_address=temporal_address)
    async with PolicyServer(MentalMathPolicy(), record_requests=True) as policy:
        options = EvalOptions(env=TransientMathEnv.name, policy=policy.url, model="mental", reps=200)
        resumed = await run_eval(replace_out(options, tmp_path / "resumed", resume=old_id), settings, out=io.StringIO())
        resumed_calls = len(policy.requests)
        fresh = replace_out(options, tmp_path / "fresh", n=TASKS, samples=SAMPLES, seed=SEED)
        uninterrupted = await run_eval(fresh, settings, out=io.StringIO())

    result = BatchResult.model_validate(resumed["results"]["policy"])
    assert result.resumed_from == old_id and result.carried == ANSWER - SAMPLES  # task 0's two failed
    merged = await read_trajectories(result.parts)
    carried, ran = indices(merged, old_id), indices(merged, result.batch_id)
    assert len(merged) == rollouts and carried.isdisjoint(ran) and carried | ran == set(range(rollouts))
    assert len(carried) == result.carried and {0, 1} <= ran  # the infra-failed ones ran again
    assert resumed_calls == len(ran) == rollouts - result.carried  # only those reached the model
    assert side(resumed) == side(uninterrupted)  # the merged result is the uninterrupted run's
    assert (result.total, result.completed, result.infra_failed) == (rollouts, rollouts, 0)

    # The dead batch was taken down, and every rollout it left open; the new batch ran only the rest.
    assert (await old.describe()).status == WorkflowExecutionStatus.TERMINATED

    async def listed(query: str) -> list[str]:
        return [w.id async for w in client.list_workflows(query)]

    still_open = await eventually(lambda: listed(f'GymflowBatch="{old_id}" AND ExecutionStatus="Running"'),
                                  lambda found: not found)  # fmt: skip
    assert still_open == []
    children = await eventually(
        lambda: listed(f'GymflowBatch="{result.batch_id}" AND WorkflowType="RolloutWorkflow"'),
        lambda found: len(found) >= len(ran),
    )
    assert {int(c.rsplit("/r", 1)[1]) for c in children} == ran
    figures.record("resume", "worker killed mid-batch, resumed", rollouts=rollouts, carried=result.carried,
                   rerun=len(ran), model_calls_on_resume=resumed_calls)  # fmt: skip


def replace_out(options: EvalOptions, out: Path, **changes: Any) -> EvalOptions:
    return replace(options, out=out, **changes)
