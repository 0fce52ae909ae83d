"""OpenEnv both ways. In: an env served by OpenEnv's own server classes, driven by OpenEnv's own
client inside its venv, through `gymflow eval`; returns match OpenEnv's own loop on the same
actions. Out: OpenEnv's client drives a gymflow env over the exporter, through a full episode."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from interop_support import Driver, gymflow_eval, record_of, require, run_reference, tool_calls
from temporalio.client import Client

from gymflow.activities.session_schema import SessionInput
from gymflow.envs.contract import Task, Trajectory
from gymflow.workers.sdk.openenv import OpenEnvExporter
from gymflow.workers.worker import RunningWorker


async def test_openenv_env_through_gymflow_eval(client: Client, temporal_address: str, tmp_path: Path) -> None:
    require("oe")
    report, trajectories = await gymflow_eval(client, temporal_address, tmp_path, "oe-guess", n=2)
    assert report["policy"]["completed"] == 2 and report["policy"]["infra_failed"] == 0
    episodes = []
    for trajectory in trajectories:
        assert trajectory.env_package is not None and trajectory.env_package.kind == "openenv"
        actions = [arguments for name, arguments in tool_calls(trajectory)]
        assert actions and all(name == "step" for name, _ in tool_calls(trajectory))
        last = json.loads([m for m in trajectory.messages if m.role == "tool"][-1].content)
        assert last["done"] and last["observation"]["hint"] == "correct"  # bisection found it
        episodes.append({"seed": int(trajectory.task_id.rsplit("-", 1)[1]), "actions": actions})
    returns = run_reference(record_of("oe"), "openenv_replay.py", {"app": "oe_guess.server:app", "episodes": episodes})
    assert [t.reward.total for t in trajectories if t.reward] == returns
    assert all(0.5 < r <= 1.0 for r in returns)  # 1 for the right guess, -0.05 per wrong one


@pytest.mark.slow  # in-process exporter; `gymflow envs serve` driven by OpenEnv's client stays default
async def test_openenv_client_drives_a_gymflow_env(client: Client, worker: RunningWorker) -> None:
    require("oe")
    task = Task(id="miles-3", prompt="How many km is 3 miles?", ground_truth=3 * 1.609344)
    template = SessionInput(env="units", task=task)
    async with OpenEnvExporter(
        client, env="units", task_queue=worker.task_queue, tasks=[task], template=template
    ) as exporter:
        driver = Driver(record_of("oe").python_path, f"http://127.0.0.1:{exporter.port}")
        try:
            episode = f"ep-{uuid.uuid4().hex[:8]}"
            first = await driver.send("reset", data={"episode_id": episode, "task_id": "miles-3"})
            assert not first["done"] and first["reward"] is None
            observed = first["observation"]
            assert observed["episode_id"] == episode and observed["messages"][-1]["content"] == task.prompt
            assert "multiply" in [t["function"]["name"] for t in observed["tools"]]
            call = {"id": "c1", "name": "multiply", "arguments": {"a": 3, "b": 1.609344}}
            step = await driver.send("step", action={"message": {"role": "assistant", "tool_calls": [call]}})
            assert not step["done"] and step["observation"]["messages"][0]["content"].startswith("4.828")
            state = await driver.send("state")
            assert state["state"]["episode_id"] == episode and state["state"]["step_count"] == 1
            answer = f"<answer>{3 * 1.609344}</answer>"
            done = await driver.send("step", action={"text": answer})
            assert done["done"] and done["reward"] == 1.0 and done["observation"]["termination"] == "final_answer"
            refused = await driver.send("step", action={"text": "again"})
            assert "the episode is over" in refused["error"]
        finally:
            driver.close()
    trajectory = await client.get_workflow_handle(f"openenv-{episode}", result_type=Trajectory).result()
    assert trajectory.turns == 2 and trajectory.tool_calls == 1
    assert trajectory.reward is not None and trajectory.reward.total == 1.0


async def test_gymflow_envs_serve_exports_an_env_to_openenvs_client(
    client: Client, worker: RunningWorker, temporal_address: str
) -> None:
    """The CLI: `gymflow envs serve units --port 0` serves the env's own dataset; OpenEnv's client
    plays an episode to its reward; SIGINT stops the server cleanly."""
    require("oe")
    argv = [str(Path(sys.executable).with_name("gymflow")), "envs", "serve", "units", "--port", "0",
            "--address", temporal_address, "--task-queue", worker.task_queue]  # fmt: skip
    server = await asyncio.create_subprocess_exec(*argv, stderr=subprocess.PIPE)
    driver: Driver | None = None
    try:
        assert server.stderr is not None
        line = (await asyncio.wait_for(server.stderr.readline(), 60)).decode()
        found = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        assert found, line
        driver = Driver(record_of("oe").python_path, found.group(1))
        episode = f"cli-{uuid.uuid4().hex[:8]}"
        first = await driver.send("reset", data={"episode_id": episode, "task_id": "miles-7"})
        assert first["observation"]["messages"][-1]["content"] == "How many km is 7 miles?", first
        done = await driver.send("step", action={"text": f"<answer>{7 * 1.609344}</answer>"})
        assert done["done"] and done["reward"] == 1.0, done
    finally:
        if driver is not None:
            driver.close()
        server.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(server.wait(), 30) == 0
    trajectory = await client.get_workflow_handle(f"openenv-{episode}", result_type=Trajectory).result()
    assert trajectory.task_id == "miles-7" and trajectory.reward is not None and trajectory.reward.total == 1.0
