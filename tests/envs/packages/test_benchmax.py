"""benchmax envs, unmodified, through `gymflow eval`: benchmax's own MathEnv from the PyPI package (an
abstract class that only lists `reward_funcs`, whose `LocalMCPEnv` starts its calculator with
`uvx` and leaves servers behind) and a `BaseEnv` the tests wrote (a workspace per rollout, sync
and async methods). Rewards match benchmax's own way of scoring the same completions, and no
process of the package outlives the eval."""

from __future__ import annotations

import time
from pathlib import Path

from interop_support import gymflow_eval, record_of, require, run_reference, tool_calls, venv_processes
from temporalio.client import Client

from gymflow.envs.contract import Message
from gymflow.envs.registry import env_class


def no_processes_left(key: str, deadline_s: float = 10.0) -> list[str]:
    """The package venv's live processes once they had `deadline_s` to go (none expected)."""
    end = time.monotonic() + deadline_s
    while (left := venv_processes(record_of(key))) and time.monotonic() < end:
        time.sleep(0.1)
    return left


async def test_benchmax_math_env_from_pypi(client: Client, temporal_address: str, tmp_path: Path) -> None:
    require("bmx")
    report, trajectories = await gymflow_eval(client, temporal_address, tmp_path, "bmx-math", n=2)
    assert report["policy"]["completed"] == 2 and report["policy"]["infra_failed"] == 0
    record = record_of("bmx")
    for trajectory in trajectories:
        assert trajectory.reward is not None and set(trajectory.reward.components) == {"reward_func"}
        assert tool_calls(trajectory)[0][0] == "calculate"  # the calculator benchmax started, via `uvx`
        assert trajectory.env_package is not None and trajectory.env_package.kind == "benchmax"
        assert (trajectory.env_package.version, trajectory.env_package.digest) == (record.version, record.digest)
    assert sorted(t.reward.total for t in trajectories if t.reward) == [1.0] * 2
    # benchmax's own scoring of the same completions (its reward functions, called as its adapter does)
    truths = {t.id: t.ground_truth for t in env_class("bmx-math").load_dataset("generated")}
    job = {
        "target": "benchmax.envs.math.math_env:MathEnv",
        "trajectories": [
            {
                "messages": [m.model_dump(mode="json") for m in t.messages],
                "ground_truth": truths[t.task_id],
                "init_args": {},
            }
            for t in trajectories
        ],
    }
    assert run_reference(record, "benchmax_replay.py", job) == [t.reward.components for t in trajectories if t.reward]
    assert no_processes_left("bmx") == []  # LocalMCPEnv's calculators included


async def test_benchmax_base_env_of_the_tests(client: Client, temporal_address: str, tmp_path: Path) -> None:
    require("bmx")
    report, trajectories = await gymflow_eval(client, temporal_address, tmp_path, "bmx-notes", n=2)
    assert report["policy"]["completed"] == 2 and report["policy"]["mean"]["value"] == 2.0  # note + answer
    truths = {t.id: t.ground_truth for t in env_class("bmx-notes").load_dataset("generated")}
    job = {
        "target": "bmx_envs.notes:NotesEnv",
        "trajectories": [
            {
                "messages": [m.model_dump(mode="json") for m in t.messages],
                "ground_truth": truths[t.task_id],
                "init_args": {},
            }
            for t in trajectories
        ],
    }
    assert run_reference(record_of("bmx"), "benchmax_replay.py", job) == [
        t.reward.components for t in trajectories if t.reward
    ]
    assert no_processes_left("bmx") == []


async def test_workspace_methods_reach_the_benchmax_env(tmp_path: Path) -> None:
    """copy_to_workspace / copy_from_workspace go to the env's own workspace (its NotesEnv keeps one
    per rollout, not the bridge's directory), and rollouts of one env instance stay apart."""
    require("bmx")
    env = env_class("bmx-notes")(workspace_root=tmp_path / "workspaces", pool_size=0)
    try:
        await env.init_rollout("r1")
        await env.init_rollout("r2", seed_text="other")
        await env.copy_content_to_workspace("r1", "amber", "note.txt")
        assert (await env.run_tool("r1", "read_note")).text == "amber"
        assert (await env.run_tool("r2", "read_note")).text == "other"  # each rollout its own bridge and note
        await env.run_tool("r1", "write_note", text="basalt")
        await env.copy_from_workspace("r1", "note.txt", tmp_path / "out.txt")
        assert (tmp_path / "out.txt").read_text() == "basalt"
        completion = [Message(role="assistant", content="<answer>basalt</answer>")]
        reward = await env.compute_reward("r1", completion, "basalt")
        assert reward.components == {"note": 1.0, "answer": 1.0} and reward.total == 2.0
        assert [t.name for t in await env.list_tools()] == ["write_note", "read_note"]  # no control tools
    finally:
        await env.shutdown()
    assert no_processes_left("bmx") == []
