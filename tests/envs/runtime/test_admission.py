"""Node-level admission control (gymflow.envs.runtime.admission) and how the env activities use it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp_support import wait_until
from temporalio.testing import ActivityEnvironment

from gymflow.activities.env import EnvActivities
from gymflow.activities.env_schema import CallToolInput
from gymflow.envs.contract import BaseEnv, Message, ToolCall, ToolResult, ToolSpec
from gymflow.envs.errors import InfraError
from gymflow.envs.registry import register
from gymflow.envs.runtime.admission import Admission, Capacity


def test_capacity_follows_cores_and_memory() -> None:
    two = Capacity.detect(cpus=2, memory_mb=16_000)
    assert (two.starts, two.runs, two.rewards, two.cpu_workers, two.window) == (2, 4, 2, 2, 32)
    assert Capacity.detect(cpus=16, memory_mb=64_000).window == 166  # memory-bound: half of it, 192 MB each
    assert Capacity.detect(cpus=1, memory_mb=100).window == 4  # never below 4


async def test_slots_bound_concurrency_and_queue_in_order() -> None:
    admission = Admission(Capacity(starts=1, runs=2, rewards=1, cpu_workers=1, window=4))
    running, peak, order = 0, 0, []
    gate = asyncio.Event()

    async def step(i: int) -> None:
        nonlocal running, peak
        async with admission.slot("run"):
            running += 1
            peak = max(peak, running)
            order.append(i)
            await gate.wait()
            running -= 1

    tasks = [asyncio.create_task(step(i)) for i in range(5)]
    await wait_until(lambda: admission.stats()["run"]["waiting"] == 3, what="three queued steps")
    assert admission.stats()["run"] == {"slots": 2, "busy": 2, "waiting": 3}
    gate.set()
    await asyncio.gather(*tasks)
    assert peak == 2 and order == [0, 1, 2, 3, 4]
    assert admission.stats()["run"] == {"slots": 2, "busy": 0, "waiting": 0}


def _pid_and_nice() -> tuple[int, int]:
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)


async def test_cpu_work_runs_in_a_lower_priority_process() -> None:
    admission = Admission(Capacity(starts=1, runs=1, rewards=1, cpu_workers=1, window=4), nice=5)
    try:
        pid, nice = await admission.cpu(_pid_and_nice)
        assert pid != os.getpid()
        assert nice >= min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
        # What cannot travel to the pool (a closure) runs in a thread of this process instead.
        assert await admission.cpu(lambda: os.getpid()) == os.getpid()  # noqa: PLW0108 - a closure on purpose
    finally:
        admission.shutdown()


class GatedEnv(BaseEnv):
    """A CPU-bound env whose tool blocks until the test opens its gate."""

    name = "gated-admission-test"
    cpu_bound = True
    gate: asyncio.Event
    started: list[str]

    async def list_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="work", description="blocks", parameters={"type": "object"})]

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        self.started.append(rollout_id)
        await self.gate.wait()
        return ToolResult(text=f"done {rollout_id}")

    async def compute_reward(self, rollout_id: str, completion: list[Message], ground_truth: Any, **kw: Any) -> float:
        return 1.0


async def test_a_queued_tool_call_heartbeats_and_its_timeout_runs_from_admission(tmp_path: Path) -> None:
    register(GatedEnv.name, GatedEnv)
    admission = Admission(Capacity(starts=1, runs=1, rewards=1, cpu_workers=1, window=4))
    activities = EnvActivities(node_id="n", node_queue="q@n", workspace_root=tmp_path, admission=admission)
    env = activities.env(GatedEnv.name)
    assert isinstance(env, GatedEnv)
    env.gate, env.started = asyncio.Event(), []

    def call(key: str, timeout_s: float) -> CallToolInput:
        return CallToolInput(env=GatedEnv.name, state_key=key, call=ToolCall(id=key, name="work"), timeout_s=timeout_s)

    holder, queued = ActivityEnvironment(), ActivityEnvironment()
    holder.info = queued.info = dataclasses.replace(holder.info, heartbeat_timeout=timedelta(seconds=1.5))
    beats: list[float] = []
    queued.on_heartbeat = lambda *_: beats.append(time.monotonic())

    first = asyncio.create_task(holder.run(activities.call_tool, call("first", 60)))
    await wait_until(lambda: env.started == ["first"], what="the first call running")
    # The second call waits for the only run slot for longer than its own 0.5 s timeout ...
    second = asyncio.create_task(queued.run(activities.call_tool, call("second", 0.5)))
    # ... heartbeating while it waits (every ~0.5 s here) ...
    await wait_until(lambda: len(beats) >= 2, what="heartbeats of the queued call")
    assert env.started == ["first"] and admission.stats()["run"]["waiting"] == 1
    env.gate.set()
    # ... and once admitted it runs to completion: the wait did not count against its timeout.
    assert (await first).text == "done first"
    result = await second
    assert not result.is_error and result.text == "done second"


async def test_envs_that_are_not_cpu_bound_are_never_queued(tmp_path: Path) -> None:
    register(GatedEnv.name + "-io", type("IoEnv", (GatedEnv,), {"cpu_bound": False}))
    admission = Admission(Capacity(starts=1, runs=1, rewards=1, cpu_workers=1, window=4))
    activities = EnvActivities(node_id="n", node_queue="q@n", workspace_root=tmp_path, admission=admission)
    env = activities.env(GatedEnv.name + "-io")
    assert isinstance(env, GatedEnv)
    env.gate, env.started = asyncio.Event(), []
    inputs = [
        CallToolInput(env=GatedEnv.name + "-io", state_key=k, call=ToolCall(id=k, name="work")) for k in ("a", "b")
    ]
    calls = [asyncio.create_task(ActivityEnvironment().run(activities.call_tool, i)) for i in inputs]
    # Both run at once although the node has one run slot.
    await wait_until(lambda: len(env.started) == 2, what="both calls running")
    env.gate.set()
    assert [(await c).text for c in calls] == ["done a", "done b"]


POOL_ORPHAN = """
import asyncio, os
from gymflow.envs.runtime.admission import Admission, Capacity

async def main():
    admission = Admission(Capacity(starts=1, runs=1, rewards=1, cpu_workers=1, window=4))
    print(await admission.cpu(os.getpid), flush=True)
    os._exit(0)  # killed outright: no shutdown of the pool

asyncio.run(main())
"""


async def test_pool_processes_leave_with_a_worker_killed_outright() -> None:
    root = Path(__file__).resolve().parents[3]
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-c", POOL_ORPHAN, cwd=root, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await run.communicate()
    pool_pid = int(out.decode().split()[-1])
    await wait_until(lambda: not Path(f"/proc/{pool_pid}").exists() or _zombie(pool_pid), what="the pool to exit")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_a_pool_process_that_dies_fails_its_call_as_infra_and_the_next_call_gets_a_fresh_pool() -> None:
    admission = Admission(Capacity(starts=1, runs=1, rewards=1, cpu_workers=1, window=4), nice=0)
    try:
        with pytest.raises(InfraError, match="process pool stopped"):
            await admission.cpu(os._exit, 3)
        pid, _ = await admission.cpu(_pid_and_nice)
        assert pid != os.getpid()
    finally:
        admission.shutdown()


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path: Path) -> None:
    # The pool's processes start by importing the script again: its top-level code runs there too.
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import asyncio, os\n"
        "from gymflow.envs.runtime.admission import Admission, Capacity\n"
        "admission = Admission(Capacity(starts=1, runs=1, rewards=1, cpu_workers=1, window=4), nice=0)\n"
        "try:\n"
        "    asyncio.run(admission.cpu(os.getpid))\n"
        "finally:\n"
        "    admission.shutdown()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr.splitlines()[-1]
