"""gymflow's workflow runner (gymflow.workers.sandbox_runner): the SDK's sandbox, minus its per-payload entries.

The runner answers the SDK's serialization-context lookups without entering the sandbox. These tests
prove the answers are the SDK's own (every lookup of every recorded history compared), that the fast
path is really the one taken (an SDK release that moves the internals fails here, not silently
slower), and that workflow code is still sandboxed: a workflow reading the wall clock still fails.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import inspect
import re
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.worker import Replayer, Worker
from temporalio.worker._workflow_instance import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import RestrictedWorkflowAccessError
from temporalio.worker.workflow_sandbox import _runner as sdk_runner

# This module holds a workflow, so the sandbox re-imports it: what it imports passes through.
with workflow.unsafe.imports_passed_through():
    from gymflow.workers import sandbox_runner
    from gymflow.workers.sdk.client import DATA_CONVERTER
    from gymflow.workers.worker import SANDBOX_RESTRICTIONS, WORKFLOW_RUNNER, WORKFLOWS

HISTORIES = sorted((Path(__file__).parents[1] / "workflows" / "histories").glob("*.json"))


def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(re.split(r"_plan|_run\d", path.stem)[0], path.read_text())


class _Comparing(sandbox_runner._Instance):
    """Answers as gymflow's runner does and records what the SDK's own path answers beside it."""

    pairs: list[tuple[Any, Any]] = []

    def get_serialization_context(self, command_info: Any) -> Any:
        fast = super().get_serialization_context(command_info)
        _Comparing.pairs.append((fast, sdk_runner._Instance.get_serialization_context(self, command_info)))
        return fast

    def get_external_store_context(self, command_info: Any) -> Any:
        fast = super().get_external_store_context(command_info)
        _Comparing.pairs.append((fast, sdk_runner._Instance.get_external_store_context(self, command_info)))
        return fast


class _ComparingRunner(sandbox_runner.FastContextRunner):
    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Comparing(det, self.runner_class, self.restrictions)


async def test_context_lookups_answer_as_the_sdk_does_for_every_recorded_history() -> None:
    _Comparing.pairs = []
    runner = _ComparingRunner(restrictions=SANDBOX_RESTRICTIONS)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=runner)
    for path in HISTORIES:
        await replayer.replay_workflow(_history(path))
    assert len(_Comparing.pairs) > 100
    kinds = {type(fast).__name__ for fast, _ in _Comparing.pairs}
    # Activities, child workflows and the workflow's own payloads all came by.
    assert {"ActivitySerializationContext", "WorkflowSerializationContext", "StorageDriverStoreContext"} <= kinds
    assert all(fast == sdk for fast, sdk in _Comparing.pairs)


async def test_the_fast_path_is_the_one_taken(caplog: pytest.LogCaptureFixture) -> None:
    before = sandbox_runner._Instance.fast_lookups
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=WORKFLOW_RUNNER)
    with caplog.at_level("WARNING", logger=sandbox_runner.__name__):
        await replayer.replay_workflow(_history(next(p for p in HISTORIES if p.stem == "math_fused")))
    assert sandbox_runner._Instance.fast_lookups - before >= 10
    assert not [r for r in caplog.records if "slower path" in r.getMessage()]


@workflow.defn(name="ReadsTheWallClock")
class _ReadsTheWallClock:
    @workflow.run
    async def run(self) -> str:
        return datetime.datetime.now().isoformat()  # the sandbox forbids this in workflow code


async def test_workflow_code_is_still_sandboxed(client: Client) -> None:
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[_ReadsTheWallClock],
        workflow_runner=WORKFLOW_RUNNER,
        # Fail the workflow on the sandbox's error rather than retry its task until the timeout.
        workflow_failure_exception_types=[RestrictedWorkflowAccessError],
    ):
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                "ReadsTheWallClock",
                id=f"sandbox-{uuid.uuid4().hex}",
                task_queue=queue,
                execution_timeout=datetime.timedelta(seconds=30),
            )
    assert "Cannot access datetime.datetime.now" in str(failed.value.cause)


def test_the_sdk_method_the_runner_repeats_is_the_one_it_was_written_against() -> None:
    source = textwrap.dedent(inspect.getsource(sdk_runner._Instance._run_code))
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == sandbox_runner.SDK_RUN_CODE_SHA256, (
        "temporalio changed _Instance._run_code: bring workers/sandbox_runner.py's copy in line, then the hash"
    )


async def test_an_sdk_without_the_in_sandbox_object_gets_its_own_lookups_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_runner, "IN_SANDBOX", "__moved_by_a_later_sdk__")
    monkeypatch.setattr(sandbox_runner, "_warned", set())
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=WORKFLOW_RUNNER)
    with caplog.at_level("WARNING", logger=sandbox_runner.__name__):
        await replayer.replay_workflow(_history(next(p for p in HISTORIES if p.stem == "math_fused")))
    warnings = [r.getMessage() for r in caplog.records if "slower path" in r.getMessage()]
    assert len(warnings) == 2  # once per lookup kind, not once per payload


_RUNS_OF_THIS_MODULE: list[int] = []
"""Module state: a run that sees another run's appends would show the module was not run afresh."""


@workflow.defn(name="CountsItsModuleRuns")
class _CountsItsModuleRuns:
    @workflow.run
    async def run(self) -> int:
        _RUNS_OF_THIS_MODULE.append(1)
        return len(_RUNS_OF_THIS_MODULE)


async def test_workflow_modules_compile_once_and_still_run_afresh_per_run(client: Client) -> None:
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    hits = sandbox_runner.ModuleCodeCache.hits
    async with Worker(client, task_queue=queue, workflows=[_CountsItsModuleRuns], workflow_runner=WORKFLOW_RUNNER):
        counts = [
            await client.execute_workflow("CountsItsModuleRuns", id=f"sandbox-{uuid.uuid4().hex}", task_queue=queue)
            for _ in range(3)
        ]
    assert counts == [1, 1, 1]  # each run executed the module anew: its state is the run's own
    assert sandbox_runner.ModuleCodeCache.hits - hits >= 3  # ... from code compiled once
    assert __name__ in sandbox_runner.ModuleCodeCache.modules


def test_a_changed_module_file_is_compiled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "gymflow_cache_probe.py"
    source.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sandbox_runner.ModuleCodeCache.cover("gymflow_cache_probe")

    def fresh_import() -> Any:
        monkeypatch.delitem(sys.modules, "gymflow_cache_probe", raising=False)
        return importlib.import_module("gymflow_cache_probe")

    hits = sandbox_runner.ModuleCodeCache.hits
    assert fresh_import().VALUE == 1
    assert fresh_import().VALUE == 1
    assert sandbox_runner.ModuleCodeCache.hits - hits == 1
    source.write_text("VALUE = 22\n")  # another size: a new version even within the mtime's resolution
    assert fresh_import().VALUE == 22
