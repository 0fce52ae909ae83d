"""`gymflow worker --processes N`: a supervisor of N worker processes, each a node of its own.

The supervisor runs as a real subprocess against the session's dev server; rollouts are real math
rollouts against the baseline policy over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
from mcp_support import ROOT, node_queues_of, wait_polling
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import RolloutInput, RolloutResult
from gymflow.activities.turn import TURN_ACTIVITY
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.mcp.ledger import start_time
from gymflow.workers.cli.main import main
from gymflow.workers.config import Settings
from gymflow.workers.processes import Supervisor, child_environment, parse_processes
from gymflow.workers.sdk.client import start_rollout

ENV_ACTIVITIES = ("call_tool", "compute_reward", TURN_ACTIVITY, "release_rollout")
"""The activities a rollout schedules on its node's queue (math fuses its turns into `play_turn`)."""


def descendants(pid: int) -> set[tuple[int, int | None]]:
    """(pid, start time) of every live descendant of `pid`, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {(p, start_time(p)) for p in found}


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def children_by_node(pid: int) -> dict[str, int]:
    """The supervisor's direct children: node id (GYMFLOW_NODE_ID of their environment) -> pid."""
    found = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"GYMFLOW_NODE_ID="):
                found[item.split(b"=", 1)[1].decode()] = int(child)
    return found


async def poll_until(check, *, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        await asyncio.sleep(0.1)
    return value


async def poller_pids(client: Client, queue: str) -> set[int]:
    """Pids of the workers polling `queue` (the SDK's default identity is `pid@host`)."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    return {int(p.identity.split("@")[0]) for p in response.pollers if p.identity.split("@")[0].isdigit()}


class Fleet:
    """A `gymflow worker --processes 2` subprocess on a private queue."""

    def __init__(self, temporal_address: str, tmp_path: Path) -> None:
        self.queue = f"procs-{uuid.uuid4().hex[:8]}"
        self.node = f"node-{uuid.uuid4().hex[:6]}"
        self.log = tmp_path / "worker.log"
        self.env = {
            **os.environ,
            "GYMFLOW_TEMPORAL_ADDRESS": temporal_address,
            "GYMFLOW_TASK_QUEUE": self.queue,
            "GYMFLOW_NODE_ID": self.node,
            "GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
            "GYMFLOW_DATA_DIR": str(tmp_path / "data"),
            "GYMFLOW_MCP_POOL_SIZE": "2",  # one warm server per child: shutdown must stop them too
        }
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Fleet:
        with self.log.open("wb") as out:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gymflow.workers.cli", "-v", "--log-format", "json", "worker", "--processes", "2",
                cwd=ROOT, env=self.env, stdout=out, stderr=out,
            )  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def queue_of(self, node: str) -> str:
        return node_queue(self.queue, node)

    def lines(self) -> list[dict[str, object]]:
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    async def rollouts(self, client: Client, policy_url: str, n: int, seed: int) -> list[tuple[str, RolloutResult]]:
        model = ModelConfig(base_url=policy_url)
        handles = [
            await start_rollout(client, RolloutInput(env="math", task=task, model=model), task_queue=self.queue)
            for task in generate_tasks(n, seed=seed, difficulty=(1, 2))
        ]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 90)
        return [(h.id, r) for h, r in zip(handles, results, strict=True)]

    async def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), 90)


def solved(result: RolloutResult) -> bool:
    return not result.infra_failed and result.reward is not None and result.reward.total == 1.0


@pytest.mark.timeout(240)
@pytest.mark.heavy
async def test_two_processes_run_rollouts_on_both_nodes_and_stop_cleanly(
    client: Client, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    async with Fleet(temporal_address, tmp_path) as fleet:
        nodes = [f"{fleet.node}-p0", f"{fleet.node}-p1"]
        await wait_polling(client, [fleet.queue_of(n) for n in nodes])
        used: set[str] = set()
        results: list[RolloutResult] = []
        for round_ in range(5):  # which child takes an init is the server's choice: run rounds until both did
            for workflow_id, result in await fleet.rollouts(client, calculator_policy_url, 6, seed=round_):
                results.append(result)
                for activity in ENV_ACTIVITIES:
                    used.update(await node_queues_of(client, workflow_id, activity))
            if len(used) == 2:
                break
        assert all(solved(r) for r in results), [(r.task_id, r.termination, r.error) for r in results if not solved(r)]
        assert used == {fleet.queue_of(n) for n in nodes}, used
        children = children_by_node(fleet.pid)
        assert set(children) == set(nodes), children
        # Every process the fleet started (the children, their warm MCP servers, pool processes).
        started = descendants(fleet.pid)
        servers = [p for p, _ in started if b"gymflow.envs.builtin.math.servers.calculator" in cmdline(p)]
        assert len(servers) >= 2, "each child keeps a warm calculator server"
        assert await fleet.stop() == 0
        await poll_until(
            lambda: not {(p, t) for p, t in started if start_time(p) == t},
            timeout_s=30,
            what="every child and MCP server to exit",
        )
    lines = fleet.lines()
    for node in nodes:  # children log with their node id
        assert any(line.get("node") == node and line.get("event") == "worker polling" for line in lines), node


@pytest.mark.slow  # kill -9 chaos
@pytest.mark.timeout(240)
async def test_a_killed_child_is_restarted_and_a_killed_supervisor_takes_its_children_along(
    client: Client, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    async with Fleet(temporal_address, tmp_path) as fleet:
        nodes = [f"{fleet.node}-p0", f"{fleet.node}-p1"]
        await wait_polling(client, [fleet.queue_of(n) for n in nodes])
        # Rollouts first: a child starts its env (and the env's warm server) on its first rollout.
        for _, result in await fleet.rollouts(client, calculator_policy_url, 4, seed=3):
            assert solved(result), (result.termination, result.error)

        def servers_of(pid: int) -> set[tuple[int, int | None]]:
            return {
                (p, t) for p, t in descendants(pid) if b"gymflow.envs.builtin.math.servers.calculator" in cmdline(p)
            }

        holding = await poll_until(
            lambda: [(n, pid) for n, pid in sorted(children_by_node(fleet.pid).items()) if servers_of(pid)],
            timeout_s=60,
            what="a child's warm MCP server",
        )
        victim_node, victim = holding[0]
        held = servers_of(victim)
        os.kill(victim, signal.SIGKILL)
        # A restarted child is a new node (it does not hold the dead one's rollouts).
        restarted = f"{victim_node}-r1"
        await wait_polling(client, [fleet.queue_of(restarted)])
        new_pid = children_by_node(fleet.pid)[restarted]
        assert new_pid != victim
        assert new_pid in await poller_pids(client, fleet.queue_of(restarted))
        # What the dead child held is freed (its servers see their stdin close; the reaper kills the rest).
        await poll_until(
            lambda: not {(p, t) for p, t in held if start_time(p) == t}, timeout_s=30, what="the orphaned server to go"
        )
        for _, result in await fleet.rollouts(client, calculator_policy_url, 4, seed=7):
            assert solved(result), (result.termination, result.error)
        # The supervisor itself killed outright: its children get SIGTERM (PR_SET_PDEATHSIG) and stop.
        started = descendants(fleet.pid)
        assert fleet.process is not None
        fleet.process.kill()
        await fleet.process.wait()
        await poll_until(
            lambda: not {(p, t) for p, t in started if start_time(p) == t},
            timeout_s=60,
            what="the children of a killed supervisor to exit",
        )
    restarts = [line for line in fleet.lines() if line.get("event") == "worker process exited; restarting"]
    assert [(r["node"], r["pid"], r["exit_code"]) for r in restarts] == [(victim_node, victim, -signal.SIGKILL)]


async def test_children_that_keep_crashing_at_start_make_the_supervisor_give_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(node_id="n", workspace_root=tmp_path / "ws", data_dir=tmp_path / "data")
    crash = [sys.executable, "-c", "import sys; sys.exit(3)"]
    supervisor = Supervisor(settings, 2, command=crash, start_grace_s=60, max_start_failures=2)
    assert await asyncio.wait_for(supervisor.run(), 60) == 1
    assert "exited 2 times in a row within 60 s of starting (last exit code 3); giving up" in capsys.readouterr().err
    assert all(c.process is not None and c.process.returncode is not None for c in supervisor.children)


def test_children_get_a_share_of_the_node(tmp_path: Path) -> None:
    settings = Settings(
        node_id="n",
        max_server_starts=4,
        max_tool_runs=8,
        max_rewards=1,
        cpu_workers=3,
        mcp_pool_size=2,
        max_concurrent_workflow_tasks=16,
        workspace_root=tmp_path,
    )
    env = child_environment(settings, node_id="n-p1", count=2)
    assert env["GYMFLOW_NODE_ID"] == "n-p1"
    assert env["GYMFLOW_WORKER_PROCESSES"] == "1"
    shares = {k: env[f"GYMFLOW_{k}"] for k in ("MAX_SERVER_STARTS", "MAX_TOOL_RUNS", "MAX_REWARDS", "CPU_WORKERS")}
    assert shares == {"MAX_SERVER_STARTS": "2", "MAX_TOOL_RUNS": "4", "MAX_REWARDS": "1", "CPU_WORKERS": "1"}
    assert (env["GYMFLOW_MCP_POOL_SIZE"], env["GYMFLOW_MAX_CONCURRENT_WORKFLOW_TASKS"]) == ("1", "8")
    assert child_environment(settings.model_copy(update={"mcp_pool_size": 0}), node_id="x", count=2)[
        "GYMFLOW_MCP_POOL_SIZE"
    ] == "0"  # fmt: skip
    # The child reads back exactly these settings.
    child = Settings(**{k.removeprefix("GYMFLOW_").lower(): v for k, v in env.items()})  # type: ignore[arg-type]
    assert (child.node_id, child.process_count, child.workspace_root) == ("n-p1", 1, tmp_path)


@pytest.mark.parametrize("value", ["0", "x", "-2", "1.5"])
def test_a_bad_process_count_is_a_clear_cli_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "--processes", value])
    assert exit_.value.code == 2
    assert f"argument --processes: must be a positive integer or 'auto', not '{value}'" in capsys.readouterr().err


def test_a_bad_process_count_setting_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GYMFLOW_WORKER_PROCESSES", "zero")
    assert main(["worker"]) == 2
    err = capsys.readouterr().err
    assert "gymflow: invalid setting" in err and "GYMFLOW_WORKER_PROCESSES='zero'" in err


def test_auto_is_one_process_per_core() -> None:
    assert parse_processes("auto") == "auto" == parse_processes(" AUTO ")
    assert Settings(worker_processes="auto").process_count == len(os.sched_getaffinity(0))
    assert parse_processes("3") == 3
