"""Recorded histories replay against the current workflow code (determinism and compatibility)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from workers.client import DATA_CONVERTER
from workers.worker import WORKFLOW_RUNNER, WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=WORKFLOW_RUNNER)
    # `NAME_planK.json`: a history the workflow code of an earlier plan wrote (kept to prove that
    # the patches still replay it); `NAME_runK.json`: a later run (after continue-as-new) of the
    # workflow NAME. Either way its workflow id is NAME.
    history = WorkflowHistory.from_json(re.split(r"_plan|_run\d", path.stem)[0], path.read_text())
    await replayer.replay_workflow(history)


def test_histories_are_recorded() -> None:
    assert len(HISTORIES) >= 3
