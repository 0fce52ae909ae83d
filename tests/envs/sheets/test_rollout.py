"""Sheets rollouts as Temporal workflows: a real dev server, worker, MCP server processes and HTTP policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from gymflow.envs.builtin.sheets.env import SheetsEnv
from gymflow.envs.builtin.sheets.generate import spec
from gymflow.envs.builtin.sheets.isolation import SANDBOX_ENV
from gymflow.envs.builtin.sheets.policy import ReferencePolicy
from gymflow.envs.builtin.sheets.sandbox import Guarantee, Limits
from gymflow.envs.contract import Message, Task, TerminationReason
from gymflow.envs.policy import NullPolicy
from gymflow.envs.registry import register
from gymflow.envs.runtime.confine import BWRAP_ENV
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call, play


class FastSheetsEnv(SheetsEnv):
    """The sheets env with tight limits, so a runaway program is stopped in seconds."""

    name = "sheets-fast"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(limits=Limits(cpu_s=2, wall_s=5.0, memory_mb=768, processes=32), **kwargs)


register(FastSheetsEnv.name, FastSheetsEnv)


class UnsafeSheetsEnv(SheetsEnv):
    """The sheets env opted out of guaranteed isolation (what GYMFLOW_SANDBOX=unsafe-rlimits does)."""

    name = "sheets-unsafe"
    sandbox_setting = "unsafe-rlimits"


register(UnsafeSheetsEnv.name, UnsafeSheetsEnv)


@pytest.mark.usefixtures("code_runs")
@pytest.mark.heavy
async def test_reference_rollout_scores_one(client: Client, worker: RunningWorker, tasks: list[Task]) -> None:
    task = next(t for t in tasks if t.metadata["formula_answer"])  # scores only through recalculation
    result = await play(client, worker, ReferencePolicy(), env="sheets", task=task)
    assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed
    assert result.reward is not None and result.reward.total == 1.0, result.reward
    assert result.reward.info["recalculated"] > 0
    assert result.tool_calls == 1
    assert result.sandbox is None  # guaranteed isolation: nothing to record


async def test_an_opted_out_sandbox_is_recorded_on_the_trajectory(
    client: Client, worker: RunningWorker, tasks: list[Task]
) -> None:
    problem = UnsafeSheetsEnv.unavailable()
    if problem is not None:  # e.g. as root, no pids cgroup and an interpreter a sandbox uid cannot reach
        pytest.skip(f"the opt-out cannot run model code here either: {problem}")
    result = await play(client, worker, NullPolicy(), env="sheets-unsafe", task=tasks[0])
    assert not result.infra_failed and result.reward is not None
    assert result.sandbox is not None and result.sandbox.startswith("GYMFLOW_SANDBOX=unsafe-rlimits")
    assert "fs_confined" in result.sandbox and "no_network" in result.sandbox


def _run(code: str) -> Message:
    return Message(role="assistant", tool_calls=[call("run_python", {"code": code})])


@pytest.mark.usefixtures("code_runs")
@pytest.mark.heavy
async def test_sandbox_violations_are_error_observations(
    client: Client, worker: RunningWorker, tasks: list[Task], answers: dict[str, str], temporal_address: str
) -> None:
    promised = FastSheetsEnv.sandbox_guarantees(worker.env.env("sheets-fast"))  # type: ignore[attr-defined]
    if Guarantee.PROCESS_LIMIT not in promised:  # run_python would refuse: unreachable while `code_runs`
        pytest.skip("the sandbox promises no process limit here: no fork bomb is sent to it")
    task = tasks[2]
    coords = task.init_args["generator"]
    host, _, port = temporal_address.rpartition(":")
    attempts = {
        "network": f"import socket\nsocket.create_connection(({host!r}, {port}), timeout=3)",
        "answer file": f"print(open({answers[task.id]!r}, 'rb').read())",
        "outside path": "print(open('/etc/passwd').read())",
        "memory bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 1024 * 1024))",
        "fork bomb": "import os\nwhile True:\n    os.fork()",
        "cpu loop": "while True:\n    pass",
        "sleep": "import time\ntime.sleep(600)",
    }
    turns = [_run(code) for code in attempts.values()]
    turns += [_run(spec(coords["seed"], coords["index"]).program), Message(role="assistant", content="done")]
    result = await play(client, worker, ScriptedPolicy(turns), env="sheets-fast", task=task)
    assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed
    observations = [m for m in result.messages if m.role == "tool"]
    assert len(observations) == len(attempts) + 1
    outcomes = dict(zip(attempts, observations, strict=False))
    for name, observation in outcomes.items():
        if name == "network" and Guarantee.NO_NETWORK not in promised:
            continue
        if name == "outside path" and Guarantee.FS_CONFINED not in promised:
            continue
        if name == "answer file" and not promised & {Guarantee.FS_CONFINED, Guarantee.PRIVATE_FILES}:
            continue
        assert observation.is_error, (name, observation.content)
    assert "memory" in outcomes["memory bomb"].content
    # A spinning loop hits the CPU limit, or on a loaded machine the wall clock first.
    assert "CPU time limit of 2s" in outcomes["cpu loop"].content or "wall-clock" in outcomes["cpu loop"].content
    assert "5s wall-clock limit" in outcomes["sleep"].content
    assert not observations[-1].is_error and observations[-1].content.startswith("exit status 0")
    assert result.reward is not None and result.reward.total == 1.0  # the env survived it all


@pytest.mark.usefixtures("code_runs")
@pytest.mark.heavy
async def test_bad_inputs_give_clear_errors_and_the_worker_goes_on(
    client: Client, worker: RunningWorker, tasks: list[Task], answers: dict[str, str], tmp_path: Path
) -> None:
    junk = tmp_path / "1_junk_input.xlsx"
    junk.write_bytes(b"PK\x03\x04 not really a workbook")
    broken_input = tasks[0].model_copy(update={"id": "junk:1", "init_args": {"input_path": str(junk)}})
    policy = ScriptedPolicy(
        [Message(role="assistant", tool_calls=[call("describe_workbook")]), Message(role="assistant", content="?")]
    )
    result = await play(client, worker, policy, env="sheets", task=broken_input)
    observation = next(m for m in result.messages if m.role == "tool")
    assert observation.is_error and "'input.xlsx' is not a valid .xlsx workbook" in observation.content
    assert result.reward is not None and result.reward.total == 0.0

    bad_position = tasks[0].model_copy(
        update={"ground_truth": dict(tasks[0].ground_truth, answer_position="Sheet1!A1:")}
    )
    result = await play(client, worker, NullPolicy(), env="sheets", task=bad_position)
    assert result.termination == TerminationReason.REWARD_ERROR and result.infra_failed
    assert result.error is not None and "bad answer_position 'Sheet1!A1:'" in result.error

    missing_sheet = tasks[0].model_copy(
        update={"ground_truth": {"answer_position": "Nope!A1", "answer_path": answers[tasks[0].id]}}
    )
    result = await play(client, worker, NullPolicy(), env="sheets", task=missing_sheet)
    assert result.termination == TerminationReason.REWARD_ERROR
    assert result.error is not None and "names sheet 'Nope'" in result.error

    result = await play(client, worker, ReferencePolicy(), env="sheets", task=tasks[3])  # the worker is fine
    assert result.reward is not None and result.reward.total == 1.0


@pytest.mark.heavy
async def test_without_a_sandbox_a_rollout_ends_env_unavailable_never_scored(
    client: Client, worker: RunningWorker, tasks: list[Task], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout started directly (the SDK) on a worker that has no sandbox for model code."""
    monkeypatch.setenv(BWRAP_ENV, "/nonexistent")  # a machine without bubblewrap; never uninstall it
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    result = await play(client, worker, ReferencePolicy(), env="sheets", task=tasks[3])
    assert result.termination == TerminationReason.ENV_UNAVAILABLE and result.infra_failed
    assert result.reward is None and result.tool_calls == 0
    assert result.error is not None and f"sheets cannot work on node {worker.env.node_id}" in result.error
    assert "Fix: install bubblewrap (apt-get install bubblewrap)" in result.error
    monkeypatch.setenv(SANDBOX_ENV, "unsafe-rlimits")  # the explicit opt-out still runs, and is recorded
    if SheetsEnv.unavailable() is None:
        result = await play(client, worker, ReferencePolicy(), env="sheets", task=tasks[3])
        assert not result.infra_failed and result.reward is not None and result.reward.total == 1.0
        assert result.sandbox is not None and result.sandbox.startswith(f"{SANDBOX_ENV}=unsafe-rlimits")
