"""Recorded histories replay against the current workflow code (determinism and compatibility).

Each replays under both workflow runners (gymflow.workers.sandbox_runner): gymflow's fast runner and
the SDK's stock one a worker falls back to, so a fallback never changes what a workflow does.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from gymflow.activities.names import MEMO_PLAN
from gymflow.activities.schema import ROLLOUT_PLAN
from gymflow.workers.client import DATA_CONVERTER
from gymflow.workers.roles import all_workflows
from gymflow.workers.sandbox_runner import RunnerChoice, workflow_runner

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


@pytest.mark.parametrize("runner", ["fast", "stock"])
@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path, runner: RunnerChoice) -> None:
    replayer = Replayer(
        workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner(runner)
    )
    # `NAME_planK.json`: a history the workflow code of an earlier plan wrote (kept to prove that
    # the patches still replay it); `NAME_runK.json`: a later run (after continue-as-new) of the
    # workflow NAME. Either way its workflow id is NAME.
    history = WorkflowHistory.from_json(re.split(r"_plan|_run\d", path.stem)[0], path.read_text())
    await replayer.replay_workflow(history)


def test_histories_are_recorded() -> None:
    assert len(HISTORIES) >= 3


@pytest.mark.parametrize("runner", ["fast", "stock"])
@pytest.mark.parametrize("name", ["math_fused", "math_solved"])
async def test_a_declared_plan_replays_the_marker_an_older_worker_wrote(name: str, runner: RunnerChoice) -> None:
    """A starter declared plan 2 in the memo, but a worker older than that memo key ran the rollout
    and wrote the patch marker: today's code must consume the marker again, or replay is
    nondeterministic. (These recorded histories carry the marker; the memo is added here.)"""
    recorded = json.loads((Path(__file__).parent / "histories" / f"{name}.json").read_text())
    assert sum(e["eventType"] == "EVENT_TYPE_MARKER_RECORDED" for e in recorded["events"]) == 1
    start = recorded["events"][0]["workflowExecutionStartedEventAttributes"]
    fields = start.setdefault("memo", {"fields": {}})["fields"]
    fields[MEMO_PLAN] = {"metadata": {"encoding": _b64(b"json/plain")}, "data": _b64(str(ROLLOUT_PLAN).encode())}
    replayer = Replayer(
        workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner(runner)
    )
    await replayer.replay_workflow(WorkflowHistory.from_json(name, json.dumps(recorded)))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
