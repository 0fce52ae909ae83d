"""Partitions on a multi-node fleet on one machine: `sudo python -m bench.partition [--rollouts 100]`.

Three `gymflow worker` nodes, each in its own network namespace linked to the host by a veth pair
(bench/netns.py), the dev server and the math env's baseline policy on the host's bridge address.
Three batches of math rollouts (a stateless env: a rollout whose node is lost just goes on
elsewhere; tests/chaos/test_partition.py covers a replayable one, with its tool-call ledger):

* baseline — no fault: the batch's wall time;
* 60 s partition — node 0's link goes down once a quarter of the batch has finished, and comes
  back 60 s later: wall time, rollouts recovered, seconds from the cut to each recovery (the
  recovery's `init_rollout` completing on another node), seconds from the heal until the node has
  freed the servers of its rollouts that moved (its reaper reads their histories), servers left;
* partition for good — node 1's link goes down the same way and never comes back: seconds from
  the cut until the node has freed everything itself (`GYMFLOW_FENCE_AFTER_S`), wall time.

Needs root (network namespaces) and iproute2. Writes bench/out/partition.json and partition.png (a
run's copies are in bench/results/; docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client, WorkflowHandle  # noqa: E402

from bench.netns import FleetNodes, Network, process_count, start_server  # noqa: E402
from gymflow.activities.model import ModelConfig  # noqa: E402
from gymflow.activities.names import node_queue  # noqa: E402
from gymflow.activities.schema import BatchInput, BatchResult, RetrySettings, RolloutOptions  # noqa: E402
from gymflow.activities.storage import read_trajectories  # noqa: E402
from gymflow.envs.builtin.math.data import generate_tasks  # noqa: E402
from gymflow.envs.builtin.math.policy import CalculatorPolicy  # noqa: E402
from gymflow.workers.client import connect  # noqa: E402
from gymflow.workers.servers.policy import PolicyServer  # noqa: E402
from gymflow.workers.servers.temporal import wait_until_reachable  # noqa: E402
from gymflow.workflows.group import BatchRolloutWorkflow  # noqa: E402

OUT = ROOT / "bench" / "out"
NODES = 3
SERVER = "gymflow.envs.builtin.math.servers.calculator"
NODE_TIMEOUT_S = 10.0
FENCE_S = 90.0
"""Longer than the healed partition (which must not fence), so the node cut off for good fences at 90 s."""
REAP_S = 5.0


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def recoveries_after(client: Client, workflow_id: str, cut: datetime) -> list[float]:
    """Seconds from `cut` to each recovery init_rollout of the rollout that completed after it."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    recovery: set[int] = set()
    found = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            metadata = event.user_metadata.summary.data if event.HasField("user_metadata") else b""
            if attributes.activity_type.name == "init_rollout" and b"(recovery" in metadata:
                recovery.add(event.event_id)
        elif (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and event.activity_task_completed_event_attributes.scheduled_event_id in recovery
        ):
            when = event.event_time.ToDatetime().astimezone()
            if when >= cut:
                found.append((when - cut).total_seconds())
    return found


@dataclass
class Bench:
    """The three batches, on one fleet."""

    network: Network
    nodes: FleetNodes
    client: Client
    policy_url: str
    out: Path
    n: int

    def servers(self) -> list[int]:
        return [process_count(self.network, i, SERVER) for i in range(NODES)]

    async def start(self, label: str, seed: int) -> WorkflowHandle[Any, BatchResult]:
        return await self.client.start_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env="math",
                tasks=generate_tasks(self.n, seed=seed, difficulty=(2, 3)),
                window=30,
                destination=(self.out / f"results-{label}").as_uri(),
                options=RolloutOptions(
                    model=ModelConfig(base_url=self.policy_url, request_timeout_s=10),
                    retry=RetrySettings(node_timeout_s=NODE_TIMEOUT_S, max_recoveries=5),
                ),
            ),
            id=f"bench-partition-{label}-{uuid.uuid4().hex[:6]}",
            task_queue=self.nodes.task_queue,
        )

    async def finished(self, handle: WorkflowHandle[Any, BatchResult]) -> int:
        progress = await handle.query(BatchRolloutWorkflow.progress)
        return int(progress["completed"] or 0)

    async def until_finished(self, handle: WorkflowHandle[Any, BatchResult], count: int) -> None:
        while True:
            if await self.finished(handle) >= count:
                return
            await asyncio.sleep(0.5)

    async def until_no_servers(self, node: int | None, timeout_s: float) -> float | None:
        """Seconds until `node` (every node: None) runs no server; None if it still does after `timeout_s`."""
        started = time.monotonic()
        while True:
            counts = self.servers()
            if (counts[node] if node is not None else sum(counts)) == 0:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                return None
            await asyncio.sleep(0.25)

    async def summary(self, result: BatchResult, wall_s: float, cut: datetime | None) -> dict[str, Any]:
        trajectories = await read_trajectories(result.parts)
        row: dict[str, Any] = {
            "rollouts": result.total,
            "distinct": len({t.rollout_id for t in trajectories}),
            "infra_failed": sum(t.infra_failed for t in trajectories),
            "recovered": sum(bool(t.recoveries) for t in trajectories),
            "wall_s": round(wall_s, 1),
        }
        if cut is not None:
            times = [
                s for t in trajectories if t.recoveries for s in await recoveries_after(self.client, t.rollout_id, cut)
            ]
            row["recovery_p50_s"] = round(statistics.median(times), 1) if times else None
            row["recovery_max_s"] = round(max(times), 1) if times else None
        return row

    async def baseline(self) -> dict[str, Any]:
        started = time.monotonic()
        handle = await self.start("baseline", 1)
        result = await handle.result()
        return await self.summary(result, time.monotonic() - started, None)

    async def partition_then_heal(self, node: int, seconds: float) -> dict[str, Any]:
        started = time.monotonic()
        handle = await self.start("heal", 2)
        await self.until_finished(handle, self.n // 4)
        held = self.servers()[node]
        self.network.partition(node)
        cut = datetime.now().astimezone()
        await asyncio.sleep(seconds)  # the partition's length
        during = self.servers()[node]
        self.network.heal(node)
        healed, healed_at = time.monotonic(), datetime.now(UTC)
        idle_s = await self.until_no_servers(node, 120)  # its moved rollouts' servers (or new ones done)
        result = await handle.result()
        wall = time.monotonic() - started
        left_s = await self.until_no_servers(None, max(5.0, healed + 60 - time.monotonic()))
        row = await self.summary(result, wall, cut)
        row |= {"servers_at_cut": held, "servers_at_heal": during, "node_idle_s_after_heal": _round(idle_s)}
        row["moved_states_freed_s_after_heal"] = self.freed_after(node, healed_at)
        row["servers_left_60s_after_heal"] = 0 if left_s is not None else sum(self.servers())
        return row

    def freed_after(self, node: int, healed_at: datetime) -> float | None:
        """Seconds from the heal to the node's reaper freeing the states of rollouts that moved (its log)."""
        for line in self.nodes.log(node).read_text(errors="replace").splitlines():
            if "moved to other nodes" not in line or not line.startswith("{"):
                continue
            when = datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00"))
            if when >= healed_at:
                return round((when - healed_at).total_seconds(), 1)
        return None

    async def partition_for_good(self, node: int) -> dict[str, Any]:
        started = time.monotonic()
        handle = await self.start("for-good", 3)
        await self.until_finished(handle, self.n // 4)
        held = self.servers()[node]
        self.network.partition(node)
        cut = datetime.now().astimezone()
        fenced_s = await self.until_no_servers(node, FENCE_S + 120)
        result = await handle.result()
        row = await self.summary(result, time.monotonic() - started, cut)
        return row | {"servers_at_cut": held, "fence_after_s": FENCE_S, "servers_gone_s_after_cut": _round(fenced_s)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-partition-"))
    network = Network(NODES).create()
    server = None
    nodes: FleetNodes | None = None
    try:
        server, address = start_server(network, work / "server", port=free_port(network.host_address))
        client = await wait_until_reachable(lambda: connect(address), timeout_s=90)
        nodes = FleetNodes(
            network, address, f"bench-partition-{uuid.uuid4().hex[:6]}", work / "fleet",
            env={
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                "GYMFLOW_MCP_POOL_SIZE": "0",
                "GYMFLOW_REAP_INTERVAL_S": str(REAP_S),
                "GYMFLOW_FENCE_AFTER_S": str(FENCE_S),
            },
        )  # fmt: skip
        nodes.start_all()
        queues = [node_queue(nodes.task_queue, nodes.node_id(i)) for i in range(NODES)]
        while True:  # every node polls its queue
            if all([await _polled(client, q) for q in queues]):
                break
            await asyncio.sleep(0.5)
        async with PolicyServer(CalculatorPolicy(), host=network.host_address, port=0) as policy:
            bench = Bench(network, nodes, client, policy.url, work, n=args.rollouts)
            rows = {
                "baseline": await bench.baseline(),
                "partition_60s_then_heal": await bench.partition_then_heal(0, args.partition_s),
                "partition_for_good": await bench.partition_for_good(1),
            }
    finally:
        if nodes is not None:
            nodes.stop()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        network.close()
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load": os.getloadavg(), "python": platform.python_version()},
        "nodes": NODES,
        "rollouts": args.rollouts,
        "env": "math (stateless, fused turns)",
        "node_timeout_s": NODE_TIMEOUT_S,
        "partition_s": args.partition_s,
        "results": rows,
    }


async def _polled(client: Client, queue: str) -> bool:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    return bool(described.pollers)


def plot(figures: dict[str, Any], path: Path) -> None:
    """Wall time of each batch, and the seconds from the cut to the recoveries and the node's cleanup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = figures["results"]
    healed, cut = rows["partition_60s_then_heal"], rows["partition_for_good"]
    fig, (walls, times) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = ["baseline", "60 s partition", "for good"]
    walls.bar(labels, [rows["baseline"]["wall_s"], healed["wall_s"], cut["wall_s"]], color="#4c72b0")
    walls.set_ylabel("batch wall time (s)")
    walls.set_title(f"{figures['rollouts']} rollouts on {figures['nodes']} nodes")
    events = {
        "recovery p50\n(60 s)": healed.get("recovery_p50_s"),
        "recovery max\n(60 s)": healed.get("recovery_max_s"),
        "recovery p50\n(for good)": cut.get("recovery_p50_s"),
        "recovery max\n(for good)": cut.get("recovery_max_s"),
        "node freed all\n(fence)": cut.get("servers_gone_s_after_cut"),
    }
    times.bar(list(events), [v or 0.0 for v in events.values()], color="#dd8452")
    times.axhline(figures["partition_s"], color="gray", linestyle="--", linewidth=1, label="heal (60 s run)")
    times.set_ylabel("seconds after the cut")
    times.tick_params(axis="x", labelsize=8)
    times.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--partition-s", type=float, default=60.0)
    args = parser.parse_args()
    figures = asyncio.run(measure(args))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "partition.json").write_text(json.dumps(figures, indent=2) + "\n")
    plot(figures, OUT / "partition.png")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
