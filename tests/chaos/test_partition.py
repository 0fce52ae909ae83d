"""A worker node cut off by a network partition, in the middle of a 100-rollout batch on three nodes.

Each node is a real `gymflow worker` in its own network namespace, linked to the host (where the
Temporal server and the policy endpoint listen, on the bridge address) by a veth pair
(bench/netns.py). A partition sets the host end of one node's link down: the node lives on, its
MCP servers keep running and its activities keep executing, but nothing it does reaches the
server. The counting env (tests/chaos_support.py) logs every tool execution outside the rollouts.

* 60 s, then healed: every rollout completes exactly once; the node's rollouts are re-initialised
  on the other nodes (node timeout 10 s); no tool call whose result was recorded runs again except
  as a replay the replayable env does on purpose; once healed, the node frees the servers of the
  rollouts that moved (its reaper reads their histories); no server is left anywhere 60 s after the
  heal. Recovery times are recorded.
* for good: the same for the batch, and the cut-off node, which never hears from its server again,
  frees everything it holds itself (the fence) within `FENCE_S` plus a probe or two.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import figures
import pytest
from chaos_support import (
    CountingPolicy,
    RolloutLedger,
    call_ledger,
    counting_env_file,
    counting_tasks,
    executions,
    reexecutions,
)
from mcp_support import wait_polling
from prometheus_client.parser import text_string_to_metric_families
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from bench.netns import FleetNodes, Network, process_count, start_server, unavailable
from gymflow.activities.env import RolloutHandle
from gymflow.activities.model import ModelConfig
from gymflow.activities.names import node_queue
from gymflow.activities.schema import BatchInput, BatchResult, RetrySettings, RolloutLimits, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.workers.client import connect
from gymflow.workers.metrics import SAMPLE_S
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.servers.temporal import wait_until_reachable
from gymflow.workflows.group import BatchRolloutWorkflow

REASON = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(REASON is not None, reason=f"no network namespaces here: {REASON}"),
]

NODES = 3
ROLLOUTS = 100
STEPS = 3
PARTITION_AT = 25
"""Partition node 0 once the batch has finished this many rollouts."""
PARTITION_S = 60.0
NODE_TIMEOUT_S = 10.0
FENCE_S = 30.0
"""GYMFLOW_FENCE_AFTER_S of the fleet cut off for good: a node without contact this long frees what it holds."""
DEFAULT_FENCE_S = 300.0
"""The setting's default: longer than the healed partition, so the healed node has to find what moved."""
REAP_S = 5.0
SERVER = "counter_server.py"
"""What an MCP server of the counting env has on its command line."""


@dataclass
class Fleet:
    network: Network
    nodes: FleetNodes
    client: Client
    policy_url: str
    env_file: Path
    log: Path
    queue: str


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    """Three worker nodes in namespaces; `request.param`: their GYMFLOW_FENCE_AFTER_S."""
    fence_s: float = getattr(request, "param", DEFAULT_FENCE_S)
    network = Network(NODES).create()
    server = None
    nodes: FleetNodes | None = None
    try:
        server, address = start_server(network, tmp_path / "server", port=free_port(network.host_address))
        client = await wait_until_reachable(lambda: connect(address), timeout_s=90)
        log = tmp_path / "executions.jsonl"
        env_file = counting_env_file(tmp_path, log)
        queue = f"partition-{uuid.uuid4().hex[:8]}"
        nodes = FleetNodes(
            network, address, queue, tmp_path / "fleet",
            env={
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                "GYMFLOW_MCP_POOL_SIZE": "0",  # a server per rollout: none should outlive its rollout
                "GYMFLOW_REAP_INTERVAL_S": str(REAP_S),
                "GYMFLOW_FENCE_AFTER_S": str(fence_s),
            },
        )  # fmt: skip
        nodes.start_all()
        await wait_polling(client, [node_queue(queue, nodes.node_id(i)) for i in range(NODES)], timeout_s=180)
        async with PolicyServer(CountingPolicy(), host=network.host_address, port=0) as policy:
            yield Fleet(network, nodes, client, policy.url, env_file, log, queue)
    finally:
        if nodes is not None:
            nodes.stop()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        network.close()


async def start_batch(fleet: Fleet, batch_id: str) -> WorkflowHandle[Any, BatchResult]:
    return await fleet.client.start_workflow(
        BatchRolloutWorkflow.run,
        BatchInput(
            env=str(fleet.env_file),
            tasks=counting_tasks(ROLLOUTS, STEPS),
            window=30,
            destination=(fleet.log.parent / "results").as_uri(),
            options=RolloutOptions(
                model=ModelConfig(base_url=fleet.policy_url, request_timeout_s=10),
                limits=RolloutLimits(max_turns=STEPS + 2, tool_timeout_s=10),
                retry=RetrySettings(node_timeout_s=NODE_TIMEOUT_S, max_recoveries=5),
            ),
        ),
        id=batch_id,
        task_queue=fleet.queue,
    )


async def wait_finished(handle: WorkflowHandle[Any, BatchResult], count: int, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        progress = await asyncio.wait_for(handle.query(BatchRolloutWorkflow.progress), 60)
        if int(progress["completed"]) >= count:
            return
        assert time.monotonic() < deadline, f"the batch stalled before {count} rollouts: {progress}"
        await asyncio.sleep(0.5)


def servers(fleet: Fleet) -> list[int]:
    """MCP servers running on each node."""
    return [process_count(fleet.network, i, SERVER) for i in range(NODES)]


async def wait_no_servers(fleet: Fleet, deadline: float) -> float:
    """Wait until no node runs a server; returns when (monotonic). Fails at `deadline`."""
    while any(count := servers(fleet)):
        assert time.monotonic() < deadline, f"servers still running per node: {count}"
        await asyncio.sleep(0.5)
    return time.monotonic()


async def init_nodes(client: Client, workflow_id: str) -> list[str]:
    """The node of every completed init_rollout of a rollout, in order."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled: set[int] = set()
    nodes = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == "init_rollout":
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attributes = event.activity_task_completed_event_attributes
            if attributes.scheduled_event_id in scheduled:
                [handle] = await client.data_converter.decode(attributes.result.payloads, [RolloutHandle])
                nodes.append(handle.node_id)
    return nodes


def node_log(fleet: Fleet, index: int) -> list[dict[str, Any]]:
    lines = fleet.nodes.log(index).read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def freed_rollouts(lines: list[dict[str, Any]]) -> set[str]:
    """The rollout ids of the state keys (`rollout_id#incarnation`) a node's log lines say it freed."""
    return {key.rpartition("#")[0] for line in lines for key in line.get("state_keys", [])}


async def metric_reaches_zero(fleet: Fleet, index: int) -> None:
    """The node's gymflow_live_mcp_servers gauge says 0 within a few of its sampling periods."""
    deadline = time.monotonic() + 5 * SAMPLE_S
    while (live := live_servers_metric(fleet, index)) != 0:
        assert time.monotonic() < deadline, f"node {index} still reports {live} live servers"
        await asyncio.sleep(0.5)


def live_servers_metric(fleet: Fleet, index: int) -> float:
    text = urllib.request.urlopen(fleet.nodes.metrics_url(index), timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "gymflow_live_mcp_servers":
            return sum(s.value for s in family.samples)
    raise AssertionError("the node exports no gymflow_live_mcp_servers")


async def check_batch(
    fleet: Fleet, result: BatchResult, partitioned_at: datetime, freed_by_cut_off: set[str]
) -> dict[str, Any]:
    """Exactly once, no recorded tool call run again but as a replay, the node's rollouts moved.

    `freed_by_cut_off`: the rollouts whose state the cut-off node says it freed after the cut (its
    reaper's or fence's log lines). One of those whose every recorded init completed on another node
    moved too: the node was running its init when cut off, and the server retried it elsewhere (a
    retried attempt leaves no trace in the history).
    """
    trajectories = await read_trajectories(result.parts)
    ids = Counter(t.rollout_id for t in trajectories)
    assert result.total == ROLLOUTS and len(ids) == ROLLOUTS, (result, len(ids))
    duplicated = sum(c - 1 for c in ids.values())
    assert duplicated == 0
    failed = [(t.task_id, t.termination, t.error) for t in trajectories if t.infra_failed or not t.reward]
    assert not failed, failed
    assert all(t.reward and t.reward.total == 1.0 for t in trajectories)  # every counter rebuilt exactly

    ran = executions(fleet.log)
    ledgers = await asyncio.gather(*(call_ledger(fleet.client, t.rollout_id) for t in trajectories))
    replayed, in_flight, cut = reexecutions(ledgers, ran)  # asserts the rule call by call
    assert len(ran) == ROLLOUTS * STEPS == sum(len(ledger.calls) for ledger in ledgers)

    cut_off = fleet.nodes.node_id(0)
    placements = {t.rollout_id: (t.recoveries, await init_nodes(fleet.client, t.rollout_id)) for t in trajectories}
    moved = sum(len(nodes) > 1 and nodes[0] == cut_off and cut_off not in nodes[1:] for _, nodes in placements.values())
    init_retried = sum(
        bool(nodes) and cut_off not in nodes
        for rollout, (_, nodes) in placements.items()
        if rollout in freed_by_cut_off
    )
    (fleet.log.parent / "placements.json").write_text(json.dumps(placements, indent=1))
    assert moved + init_retried > 0, "no rollout of the cut-off node was re-initialised elsewhere"
    recovery = recovery_seconds(ledgers, partitioned_at)
    return {
        "completed": sum(not t.infra_failed for t in trajectories),
        "duplicated": duplicated,
        "tool_calls": len(ran),
        "executions": sum(ran.values()),
        "replay_reexecutions": replayed,
        "in_flight_reexecutions": in_flight,
        "calls_cut_by_partition": cut,
        "rollouts_moved_off_node": moved,
        "inits_cut_and_retried_elsewhere": init_retried,
        "rollouts_recovered": sum(bool(t.recoveries) for t in trajectories),
        "recovery_p50_s": round(statistics.median(recovery), 1) if recovery else None,
        "recovery_max_s": round(max(recovery), 1) if recovery else None,
    }


def recovery_seconds(ledgers: list[RolloutLedger], partitioned_at: datetime) -> list[float]:
    return [
        (when - partitioned_at).total_seconds()
        for ledger in ledgers
        for when in ledger.recovered_at
        if when >= partitioned_at
    ]


async def test_a_node_partitioned_for_60s_mid_batch(fleet: Fleet) -> None:
    started = time.monotonic()
    handle = await start_batch(fleet, f"partition-60s-{uuid.uuid4().hex[:6]}")
    await wait_finished(handle, PARTITION_AT)
    held_at_partition = servers(fleet)[0]
    fleet.network.partition(0)
    partitioned_at, cut = datetime.now().astimezone(), time.monotonic()
    await asyncio.sleep(PARTITION_S)  # the scenario's duration, not a wait for an event
    still_running = servers(fleet)[0]  # cut off, not dead: its servers run on
    fleet.network.heal(0)
    healed = time.monotonic()
    result = await asyncio.wait_for(handle.result(), timeout=1800)
    finished = time.monotonic()
    drained = await wait_no_servers(fleet, deadline=max(healed + 60, finished + 15))
    await metric_reaches_zero(fleet, 0)  # what the node itself reports, over its link again

    freed = [e for e in node_log(fleet, 0) if "moved to other nodes" in str(e.get("event", ""))]
    freed_keys = sum(len(e.get("state_keys", [])) for e in freed)
    figures_ = await check_batch(fleet, result, partitioned_at, freed_rollouts(freed))
    assert held_at_partition == 0 or freed_keys > 0, "the healed node freed nothing of what moved"
    figures.record(
        "chaos", "partition a node for 60 s mid-batch, 100 rollouts, 3 nodes (netns)",
        **figures_, servers_on_node_at_cut=held_at_partition, servers_after_60s_cut=still_running,
        states_freed_after_heal=freed_keys, servers_left_after_heal=0,
        drained_s_after_heal=round(drained - healed, 1), batch_s=round(finished - started, 1),
        cut_s=round(healed - cut, 1),
    )  # fmt: skip


@pytest.mark.parametrize("fleet", [FENCE_S], indirect=True)
async def test_a_node_partitioned_for_good_fences_itself(fleet: Fleet) -> None:
    started = time.monotonic()
    handle = await start_batch(fleet, f"partition-good-{uuid.uuid4().hex[:6]}")
    await wait_finished(handle, PARTITION_AT)
    held_at_partition = servers(fleet)[0]
    fleet.network.partition(0)
    partitioned_at, cut = datetime.now().astimezone(), time.monotonic()
    # Cut off for good: it frees everything itself once FENCE_S pass without contact (plus a probe
    # round of REAP_S and its timeout).
    deadline = cut + FENCE_S + 3 * REAP_S + 15
    while process_count(fleet.network, 0, SERVER):
        assert time.monotonic() < deadline, f"node 0 still runs {servers(fleet)[0]} servers, cut off for good"
        await asyncio.sleep(0.5)
    fenced = time.monotonic()
    result = await asyncio.wait_for(handle.result(), timeout=1800)
    finished = time.monotonic()
    await wait_no_servers(fleet, deadline=finished + 15)

    fence_lines = [e for e in node_log(fleet, 0) if str(e.get("event", "")).startswith("fence:")]
    figures_ = await check_batch(fleet, result, partitioned_at, freed_rollouts(fence_lines))
    assert held_at_partition == 0 or fence_lines, "the cut-off node never fenced"
    figures.record(
        "chaos", "partition a node for good mid-batch, 100 rollouts, 3 nodes (netns)",
        **figures_, servers_on_node_at_cut=held_at_partition, fence_after_s=FENCE_S,
        servers_gone_s_after_cut=round(fenced - cut, 1), batch_s=round(finished - started, 1),
    )  # fmt: skip
