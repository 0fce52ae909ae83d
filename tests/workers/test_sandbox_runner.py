"""gymflow's workflow runners (gymflow.workers.sandbox_runner, gymflow.workers.sandbox_fast).

The fast runner answers the SDK's serialization-context lookups without entering the sandbox. These
tests prove the answers are the SDK's own (every lookup of every recorded history compared), that the
fast path is really the one taken (an SDK release that moves the internals fails here, not silently
slower), and that workflow code is still sandboxed: a workflow reading the wall clock still fails.
When the fast runner cannot run (its SDK internals missing or changed), a worker starts on the SDK's
stock runner and says why: shown here in a `gymflow worker` process whose SDK lacks them.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import json
import os
import re
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.worker import Replayer, Worker
from temporalio.worker._workflow_instance import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import RestrictedWorkflowAccessError, SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import _runner as sdk_runner

# This module holds a workflow, so the sandbox re-imports it: what it imports passes through.
with workflow.unsafe.imports_passed_through():
    from gymflow.activities.model import ModelConfig
    from gymflow.activities.schema import RolloutInput
    from gymflow.envs.builtin.math.data import generate_tasks
    from gymflow.workers import sandbox_code, sandbox_fast, sandbox_runner
    from gymflow.workers.client import DATA_CONVERTER
    from gymflow.workers.roles import all_workflows
    from gymflow.workers.sandbox_runner import SANDBOX_RESTRICTIONS, workflow_runner
    from gymflow.workers.sdk.client import run_rollout

ROOT = Path(__file__).parents[2]
HISTORIES = sorted((Path(__file__).parents[1] / "workflows" / "histories").glob("*.json"))


def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(re.split(r"_plan|_run\d", path.stem)[0], path.read_text())


class _Comparing(sandbox_fast.FastInstance):
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


class _ComparingRunner(sandbox_fast.FastContextRunner):
    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Comparing(det, self.runner_class, self.restrictions)


async def test_context_lookups_answer_as_the_sdk_does_for_every_recorded_history() -> None:
    _Comparing.pairs = []
    runner = _ComparingRunner(restrictions=SANDBOX_RESTRICTIONS)
    replayer = Replayer(workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=runner)
    for path in HISTORIES:
        await replayer.replay_workflow(_history(path))
    assert len(_Comparing.pairs) > 100
    kinds = {type(fast).__name__ for fast, _ in _Comparing.pairs}
    # Activities, child workflows and the workflow's own payloads all came by.
    assert {"ActivitySerializationContext", "WorkflowSerializationContext", "StorageDriverStoreContext"} <= kinds
    assert all(fast == sdk for fast, sdk in _Comparing.pairs)


async def test_the_fast_path_is_the_one_taken(caplog: pytest.LogCaptureFixture) -> None:
    assert isinstance(workflow_runner(), sandbox_fast.FastContextRunner)
    before = sandbox_fast.FastInstance.fast_lookups
    replayer = Replayer(workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner())
    with caplog.at_level("WARNING", logger=sandbox_fast.__name__):
        await replayer.replay_workflow(_history(next(p for p in HISTORIES if p.stem == "math_fused")))
    assert sandbox_fast.FastInstance.fast_lookups - before >= 10
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
        workflow_runner=workflow_runner(),
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


async def test_an_sdk_without_the_in_sandbox_object_gets_its_own_lookups_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_fast, "IN_SANDBOX", "__moved_by_a_later_sdk__")
    monkeypatch.setattr(sandbox_fast, "_warned", set())
    replayer = Replayer(workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner())
    with caplog.at_level("WARNING", logger=sandbox_fast.__name__):
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
    hits = sandbox_code.ModuleCodeCache.hits
    async with Worker(client, task_queue=queue, workflows=[_CountsItsModuleRuns], workflow_runner=workflow_runner()):
        counts = [
            await client.execute_workflow("CountsItsModuleRuns", id=f"sandbox-{uuid.uuid4().hex}", task_queue=queue)
            for _ in range(3)
        ]
    assert counts == [1, 1, 1]  # each run executed the module anew: its state is the run's own
    assert sandbox_code.ModuleCodeCache.hits - hits >= 3  # ... from code compiled once
    assert __name__ in sandbox_code.ModuleCodeCache.modules


def test_a_changed_module_file_is_compiled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "gymflow_cache_probe.py"
    source.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sandbox_code.ModuleCodeCache.cover("gymflow_cache_probe")

    def fresh_import() -> Any:
        monkeypatch.delitem(sys.modules, "gymflow_cache_probe", raising=False)
        return importlib.import_module("gymflow_cache_probe")

    hits = sandbox_code.ModuleCodeCache.hits
    assert fresh_import().VALUE == 1
    assert fresh_import().VALUE == 1
    assert sandbox_code.ModuleCodeCache.hits - hits == 1
    source.write_text("VALUE = 22\n")  # another size: a new version even within the mtime's resolution
    assert fresh_import().VALUE == 22


def test_stock_is_the_sdks_own_runner_with_the_same_restrictions() -> None:
    stock = workflow_runner("stock")
    assert type(stock) is SandboxedWorkflowRunner
    assert stock.restrictions is SANDBOX_RESTRICTIONS
    assert workflow_runner("fast").restrictions is SANDBOX_RESTRICTIONS  # type: ignore[attr-defined]


def test_an_sdk_whose_repeated_method_changed_gets_the_stock_runner_and_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_fast, "SDK_RUN_CODE_SHA256", "0" * 16)
    with caplog.at_level("WARNING", logger=sandbox_runner.__name__):
        runner = workflow_runner.__wrapped__("fast")  # uncached: the process's runner is already chosen
    assert type(runner) is SandboxedWorkflowRunner and runner.restrictions is SANDBOX_RESTRICTIONS
    [warning] = [r.getMessage() for r in caplog.records if "stock runner" in r.getMessage()]
    assert "_Instance._run_code changed" in warning and "GYMFLOW_WORKFLOW_RUNNER=stock" in warning


PRIVATE_SDK_MODULES = (
    "temporalio.worker.workflow_sandbox._runner",
    "temporalio.worker._workflow_instance",
    "temporalio.worker._command_aware_visitor",
    "temporalio.converter._extstore",
)

HIDE_PRIVATE_SDK = f"""
# A temporalio release that renamed its private modules, as gymflow sees it: importing any of them
# from gymflow fails, while the SDK itself (which imports them under whatever names it has) works.
import builtins

_HIDDEN = {PRIVATE_SDK_MODULES!r}
_import = builtins.__import__


def _hiding(name, globals=None, locals=None, fromlist=(), level=0):
    if (globals or {{}}).get("__name__", "").startswith("gymflow."):
        for wanted in [name, *(f"{{name}}.{{item}}" for item in fromlist or ())]:
            if wanted in _HIDDEN:
                raise ImportError(f"No module named {{wanted!r}} (hidden by the test)")
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _hiding
"""


@pytest.mark.timeout(180)
@pytest.mark.heavy
async def test_a_worker_whose_sdk_lacks_the_private_modules_starts_on_the_stock_runner(
    client: Client, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HIDE_PRIVATE_SDK)
    queue = f"stock-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
        "GYMFLOW_TEMPORAL_ADDRESS": temporal_address,
        "GYMFLOW_TASK_QUEUE": queue,
        "GYMFLOW_WORKER_ROLES": "rollout",
        "GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
        "GYMFLOW_DATA_DIR": str(tmp_path / "data"),
        "GYMFLOW_MCP_POOL_SIZE": "0",
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gymflow.workers.cli", "--log-format", "json", "worker",
            cwd=ROOT, env=env, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        task = generate_tasks(1, seed=3, difficulty=(1, 2))[0]
        input = RolloutInput(env="math", task=task, model=ModelConfig(base_url=calculator_policy_url))
        result = await asyncio.wait_for(run_rollout(client, input, task_queue=queue), 120)
        assert not result.infra_failed and result.reward is not None and result.reward.total == 1.0, result
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    [why] = [e["event"] for e in events if "stock runner" in str(e.get("event"))]
    assert "cannot be imported" in why and "hidden by the test" in why, why
    assert code == 0, log.read_text()[-3000:]
