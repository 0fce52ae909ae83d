"""Every test task on a real podman: oracle through the terminal tool scores 1.0, doing nothing 0.0, broken
verifiers are flagged (reward_error), never scored."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from mcp import Client

from gymflow.envs.builtin.harbor.task import HarborTask, load_dataset
from gymflow.envs.builtin.harbor.verifier import VerifierResult, install_solution, run_verifier, start_task
from gymflow.envs.errors import RewardError, VerifierError
from gymflow.envs.runtime.container import ContainerRuntime
from gymflow.envs.runtime.terminal import build_server

TASKS = load_dataset(Path(__file__).parent / "tasks")
FLAGGED = {"verifier_crashed", "verifier_timeout", "bad_reward"}


async def attempt(runtime: ContainerRuntime, task: HarborTask, tmp_path: Path, *, oracle: bool) -> VerifierResult:
    sandbox = await start_task(runtime, task, rollout_id=uuid.uuid4().hex[:8], workspace=tmp_path / uuid.uuid4().hex)
    try:
        if oracle:
            command = await install_solution(sandbox, task)
            async with Client(build_server(sandbox, memory_mb=task.config.environment.memory_mb)) as client:
                solved = await client.call_tool("bash", {"command": command, "timeout": task.config.agent.timeout_sec})
                expect_timeout = task.config.metadata["expect"] == "agent_timeout"
                assert solved.is_error == expect_timeout, solved.content
                if expect_timeout:
                    assert "timed out" in solved.content[0].text  # type: ignore[union-attr]
        return await run_verifier(sandbox, task)
    finally:
        await sandbox.release()


@pytest.mark.slow  # the same suite runs through the whole engine in test_harbor_eval.py (slow too)
@pytest.mark.timeout(1800)
async def test_oracle_scores_one_null_zero_and_broken_verifiers_are_flagged(
    runtime: ContainerRuntime, tmp_path: Path
) -> None:
    outcomes: dict[str, tuple[object, object]] = {}

    async def run(task: HarborTask) -> None:
        results = []
        for oracle in (True, False):
            try:
                results.append(await attempt(runtime, task, tmp_path, oracle=oracle))
            except VerifierError as exc:
                assert isinstance(exc, RewardError)  # reward_error: flagged, never a 0
                results.append(exc.reason.value)
        outcomes[task.name] = (results[0], results[1])

    # The first task alone (it bootstraps the base image when missing), then the rest at once.
    await run(TASKS[0])
    await asyncio.gather(*(run(t) for t in TASKS[1:]))

    for task in TASKS:
        expect = task.config.metadata["expect"]
        oracle, null = outcomes[task.name]
        if expect == "solvable":
            assert isinstance(oracle, VerifierResult) and oracle.reward == 1.0, (task.name, oracle)
            assert isinstance(null, VerifierResult) and null.reward == 0.0, (task.name, null)
        elif expect == "agent_timeout":
            assert isinstance(oracle, VerifierResult) and oracle.reward == 0.0, (task.name, oracle)
        else:
            assert expect in FLAGGED
            assert oracle == expect and null == expect, (task.name, oracle, null)
    partial = outcomes["partial-credit"][0]
    assert isinstance(partial, VerifierResult)
    assert partial.components == {"reward": 1.0, "files_ok": 4.0, "files_total": 4.0}
    assert partial.details == {"note": "one point per file"}


async def test_partial_credit_counts_what_was_done(runtime: ContainerRuntime, tmp_path: Path) -> None:
    task = next(t for t in TASKS if t.name == "partial-credit")
    sandbox = await start_task(runtime, task, rollout_id="partial", workspace=tmp_path / "ws")
    try:
        async with Client(build_server(sandbox)) as client:
            await client.call_tool("write_file", {"path": "a.txt", "content": "alpha\n"})
            await client.call_tool("write_file", {"path": "/app/b.txt", "content": "beta\n"})
            await client.call_tool("write_file", {"path": "c.txt", "content": "wrong\n"})
            listing = await client.call_tool("list_dir", {"path": "."})
            assert "b.txt" in listing.content[0].text  # type: ignore[union-attr]
            read = await client.call_tool("read_file", {"path": "a.txt"})
            assert read.content[0].text == "alpha\n"  # type: ignore[union-attr]
            missing = await client.call_tool("read_file", {"path": "nope.txt"})
            assert missing.is_error and "No such file" in missing.content[0].text  # type: ignore[union-attr]
        # A reward file planted by the agent is never read: the verifier's directory is emptied first.
        await sandbox.exec(["sh", "-c", "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"], timeout_s=30)
        result = await run_verifier(sandbox, task)
        assert result.reward == 0.5 and result.components["files_ok"] == 2
    finally:
        await sandbox.release()
