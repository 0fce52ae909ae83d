"""`gymflow inspect` and `gymflow status` against real rollouts, a real batch and a parent nobody serves."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from mcp_support import eventually
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import Client

from gymflow.activities import names
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, RolloutInput, RolloutOptions
from gymflow.envs.builtin.crm.policy import ReferencePolicy
from gymflow.envs.builtin.crm.tasks import generate_tasks, make_task
from gymflow.envs.builtin.math.data import generate_tasks as generate_math_tasks
from gymflow.envs.contract import Task, Trajectory
from gymflow.workers.cli import inspect, status
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import AppServer, build_app
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import BatchRolloutWorkflow

UI = "http://localhost:9999/namespaces/default"


class Gate:
    """An ASGI wrapper that answers the first `free` requests, then holds the rest until `open()`.

    The policy server runs in the test's event loop (as the worker does): the hold must await, not block.
    """

    def __init__(self, app: ASGIApp, *, free: int) -> None:
        self.app, self.free = app, free
        self.opened = asyncio.Event()

    def open(self) -> None:
        self.opened.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.free -= 1
            if self.free < 0:
                await self.opened.wait()
        await self.app(scope, receive, send)


def cli(address: str, *args: str) -> Any:
    run = subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", *args, "--address", address, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("fused", [False, True], ids=["classic", "fused-turns"])
async def test_inspect_a_running_then_finished_rollout(
    client: Client, worker: RunningWorker, temporal_address: str, fused: bool
) -> None:
    gate = Gate(build_app(ReferencePolicy()), free=1)
    task = make_task(0, 1)  # top_agent: search_products, then run_query
    async with AppServer(gate) as server:
        model = ModelConfig(base_url=server.url, model="reference")
        handle = await start_rollout(
            client, RolloutInput(env="crm", task=task, model=model, fuse_turns=fused), task_queue=worker.task_queue
        )
        try:
            running = await eventually(  # held in its second model turn, after one tool call
                lambda: inspect.inspect_workflow(client, handle.id, run_id=None, ui_url=UI),
                lambda i: len(i.steps) == (3 if fused else 4),
            )
        finally:
            gate.open()
        result = await handle.result()
    assert running.status == "RUNNING" and running.progress["tool_calls"] == 1
    turn = "play_turn" if fused else "generate"
    assert [s.activity for s in running.steps[:-1]] == ["init_rollout", turn, *([] if fused else ["call_tool"])]
    assert running.steps[-1].activity == turn and running.steps[-1].outcome == "running"
    if fused:
        await _check_fused(client, temporal_address, handle.id, task, result)
        return

    done = await inspect.inspect_workflow(client, handle.id, run_id=None, ui_url=UI)
    assert done.status == "COMPLETED" and done.ui == f"{UI}/workflows/{quote(handle.id, safe='')}/{done.run_id}/history"
    assert done.search_attributes["GymflowTask"] == task.id and done.search_attributes["GymflowReward"] == 1.0
    assert all(s.outcome == "completed" and s.duration_s is not None and s.duration_s >= 0 for s in done.steps)
    assert [s.activity for s in done.steps] == [
        "init_rollout",
        *["generate", "call_tool"] * 2,
        "generate",
        "compute_reward",
    ]
    text = inspect.render(done)
    assert "reward 1.000 (exact 1) · final_answer · 3 turns, 2 tool calls, 0 recoveries" in text
    product = task.prompt.split('"')[1]  # type: ignore[union-attr]
    assert f'crm.search_products(name="{product}")' in text
    assert "→ reward 1.0 (exact=1)" in text and f"final answer: <answer>{result.messages[-1].content[8:]}" in text

    data = cli(temporal_address, "inspect", handle.id)  # the command, as a person runs it
    assert data["result"]["reward"]["total"] == 1.0 and len(data["steps"]) == 7
    assert data["steps"][2]["result"]["text"].startswith('{"products":')


async def _check_fused(client: Client, address: str, workflow_id: str, task: Task, result: Trajectory) -> None:
    """A fused rollout's view: one step per turn, showing the reply, each call's result and the reward."""
    done = await inspect.inspect_workflow(client, workflow_id, run_id=None, ui_url=UI)
    assert [s.activity for s in done.steps] == ["init_rollout", "play_turn", "play_turn", "play_turn"]
    assert all(s.outcome == "completed" for s in done.steps)
    # Fused turns carry no summary (it costs every turn): the step is named from its input, the model
    # from the first turn's (later turns are sent as deltas, without the model settings).
    assert [s.summary for s in done.steps[1:]] == [f"reference turn {n} + tools" for n in (1, 2, 3)]
    text = inspect.render(done)
    assert "reward 1.000 (exact 1) · final_answer · 3 turns, 2 tool calls, 0 recoveries" in text
    product = task.prompt.split('"')[1]  # type: ignore[union-attr]
    assert f'calls search_products({{"name": "{product}"}})' in text and '→ search_products → {"products":' in text
    assert "→ reward 1.0 (exact=1)" in text and f"final answer: <answer>{result.messages[-1].content[8:]}" in text
    data = cli(address, "inspect", workflow_id)
    assert data["result"]["reward"]["total"] == 1.0 and len(data["steps"]) == 4
    assert data["steps"][1]["result"]["results"][0]["text"].startswith('{"products":')


def cell(text: str, workflow_id: str, column: str) -> str:
    """The cell of `column` in the row of `workflow_id` of a table `gymflow status` printed."""
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split() and line.split()[0] == workflow_id)
    header = next(lines[i] for i in range(row, -1, -1) if lines[i].strip().startswith("workflow "))
    start = header.index(column)
    after = header[start + len(column) :]
    end = start + len(column) + (len(after) - len(after.lstrip())) if after.strip() else None
    return lines[row][start:end].strip()


def _visible(found: status.Status, batch_id: str, orphan_id: str) -> bool:
    rows = {r.workflow_id: r for r in found.parents}
    batch = rows.get(batch_id)
    return orphan_id in rows and batch is not None and batch.env == "crm" and found.rollouts_running.get("crm", 0) >= 2


@pytest.mark.heavy
async def test_status_lists_running_parents_with_progress(
    client: Client, worker: RunningWorker, temporal_address: str
) -> None:
    gate = Gate(build_app(ReferencePolicy()), free=2)  # each rollout's first turn
    async with AppServer(gate) as server:
        batch = await client.start_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env="crm",
                tasks=generate_tasks(2, seed=0),
                options=RolloutOptions(model=ModelConfig(base_url=server.url, model="reference")),
                label="reference",
            ),
            id=f"status-batch-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
        # A dataset run (written elsewhere) that no worker serves: listed, its progress unavailable.
        orphan = await client.start_workflow(
            names.DATASET_WORKFLOW,
            {"n": 1},
            id=f"status-ds-{uuid.uuid4().hex[:8]}",
            task_queue=f"nobody-{uuid.uuid4().hex}",
        )
        try:
            await eventually(lambda: batch.query(BatchRolloutWorkflow.progress), lambda p: p["in_flight"] == 2)
            # Visibility is eventually consistent: the batch's env and its children's attributes are
            # upserted by the workflows and show in listings a moment later.
            found = await eventually(
                lambda: status.collect(client, ui_url=UI, timeout_s=1.0),
                lambda s: _visible(s, batch.id, orphan.id),
            )
            from_cli = cli(temporal_address, "status")
        finally:
            gate.open()
            await orphan.terminate()
        result = await batch.result()
    rows = {r.workflow_id: r for r in found.parents}
    assert rows[batch.id].env == "crm" and rows[batch.id].ui == f"{UI}/workflows/{batch.id}"
    child = await inspect.inspect_workflow(client, f"{batch.id}/r0", run_id=None, ui_url=UI)
    assert child.ui.startswith(f"{UI}/workflows/{batch.id}%2Fr0/")  # a '/' in an id is escaped for the UI
    assert rows[batch.id].progress["in_flight"] == 2 and rows[batch.id].progress["completed"] == 0
    assert isinstance(rows[orphan.id].progress, str) and rows[orphan.id].progress.startswith("unavailable")
    assert found.rollouts_running.get("crm", 0) >= 2
    text = status.render(found)
    assert text.index("BatchRolloutWorkflow") < text.index("DatasetGenerationWorkflow")
    assert cell(text, batch.id, "env") == "crm" and cell(text, batch.id, "in flight") == "2"
    assert cell(text, batch.id, "done") == "0" and cell(text, batch.id, "web ui") == rows[batch.id].ui
    assert "{" not in text  # tables, never a dict
    assert "unavailable: no worker answered" in next(line for line in text.splitlines() if orphan.id in line)
    assert batch.id in {r["workflow_id"] for r in from_cli["parents"]}
    # The batch wrote its report when it ended, named after its policy.
    assert result.completed == 2 and result.mean_reward == 1.0 and result.report is not None
    page = Path(result.report.removeprefix("file://")).read_text()
    assert "<title>crm: reference</title>" in page


async def test_inspect_shows_local_model_turns(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    task = generate_math_tasks(1, seed=3)[0]
    model = ModelConfig(base_url=calculator_policy_url, local_activity=True)  # turns recorded as markers
    handle = await start_rollout(client, RolloutInput(env="math", task=task, model=model), task_queue=worker.task_queue)
    result = await handle.result()
    seen = await inspect.inspect_workflow(client, handle.id, run_id=None, ui_url=UI)
    turns = [s for s in seen.steps if s.activity == "generate"]
    assert len(turns) == result.turns and all(s.summary == "generate (local)" for s in turns)
    assert all(s.outcome == "completed" and s.duration_s is not None and s.duration_s >= 0 for s in turns)
    assert "<answer>" in inspect.render(seen).split("final answer: ")[1]
    assert inspect.render(seen).count("→ says") + inspect.render(seen).count(" calls ") >= result.turns
