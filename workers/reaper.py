"""The node's reaper: frees the rollouts whose workflow closed without releasing them.

A rollout releases its servers and workspace itself when it finishes, fails or is cancelled. A
workflow closed from outside runs no more code: `temporal workflow terminate`, a run or execution
timeout, a reset (which terminates the run it replaces), or a parent's TERMINATE close policy.
Its servers would then live until the worker exits. So every worker checks, every
`Settings.reap_interval_s`, the workflows of the rollouts it holds (`EnvActivities.held`) against
the server and frees those that are no longer running.

It asks with DescribeWorkflowExecution (strongly consistent), never a visibility list query,
which may not show a workflow that has just started. It describes the workflow's latest run: a
reset run may go on using the state its predecessor initialised (when the reset point is after
`init_rollout`), so the state is kept while the workflow id has a running run, and freed once
none does. A workflow the server no longer knows (retention expired) counts as closed; a server
that cannot be reached counts as nothing (the next round asks again).

Each round also reaps the servers and workspaces of dead workers on this host
(gymflow.envs.mcp.ledger.reap_orphans), which otherwise happens only when a worker starts, and the
containers they left (gymflow.envs.runtime.node.NodeRuntimes.reap: their owner's lock is free) or
this worker leaked; that one runs at once too, so a restarted worker clears a killed one's containers.

A node cut off from its server (a network partition: the node is alive, its servers run, its
activities go on executing) must not go on serving rollouts that moved. While it cannot poll, its
rollouts' next env steps miss their schedule-to-start timeout and the workflows re-initialise them
on other nodes; the node cannot know which. So the reaper probes the server every `PROBE_S`:

* when contact comes back after a failed probe, every rollout state it holds whose workflow still
  runs is checked against that workflow's history (read backwards to its last `init_rollout`): a
  rollout initialised again since (a later incarnation, or the same one completed on another node:
  an init cut off mid-run is retried elsewhere under the same key) moved, and its state here is
  freed; one whose latest init is still in flight is asked again on the next probes. Its
  activities that were cut off learn the same from the server (their heartbeats fail, and the SDK
  cancels them);
* while there is no contact, after `fence_after_s` the node frees everything it holds (the
  fence): by then every rollout that needed a step has moved, and a node that never hears from its
  server again must not keep servers and containers alive for nobody. A rollout that had not
  needed a step meanwhile finds its state gone when it does, and recovers like one whose node died.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest, GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities.env import EnvActivities, InitRolloutInput, RolloutHandle, state_key
from gymflow.envs.mcp.ledger import reap_orphans
from gymflow.envs.runtime.node import NodeRuntimes

log = logging.getLogger(__name__)

DESCRIBE_CONCURRENCY = 16
"""Describe calls in flight at once, per worker."""
PROBE_S = 5.0
"""How often the reaper checks that the server answers (at most its reaping interval)."""
PROBE_TIMEOUT = timedelta(seconds=5)
HISTORY_PAGE = 64
"""Events per page when a history is read backwards to its last init_rollout."""
MOVED_RECHECKS = 12
"""Probe rounds after contact comes back in which held states `moved` could not tell about are asked
again (an init in flight at the cut); past that, the rollout's closing (`reap_closed`) frees them."""
ROUND_TIMEOUT_S = 20.0
"""A round of server calls (`reap_closed`, `reap_moved`) that takes longer is abandoned: a link that
goes down mid-round leaves its calls retrying, and the probes and the fence must go on meanwhile."""


async def workflow_closed(client: Client, workflow_id: str) -> bool | None:
    """Whether `workflow_id` has no running run (None: the server could not tell us now)."""
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return True
        log.debug("cannot describe workflow", extra={"workflow_id": workflow_id, "error": str(exc)})
        return None
    return description.status != WorkflowExecutionStatus.RUNNING


async def reap_closed(client: Client, env: EnvActivities) -> list[str]:
    """Free every rollout state of `env` whose workflow is closed; returns the freed state keys."""
    by_workflow: dict[str, list[tuple[str, str]]] = {}
    for held, workflow_id in env.held().items():
        by_workflow.setdefault(workflow_id, []).append(held)
    semaphore = asyncio.Semaphore(DESCRIBE_CONCURRENCY)
    freed: list[str] = []

    async def check(workflow_id: str, states: list[tuple[str, str]]) -> None:
        async with semaphore:
            closed = await workflow_closed(client, workflow_id)
        if not closed:
            return
        for name, key in states:
            try:
                await env.release(name, key)
            except Exception:  # one bad release must not stop the others; the next round retries
                log.warning("reaper: release failed", extra={"state_key": key, "env": name}, exc_info=True)
                continue
            freed.append(key)
        log.warning(
            "reaper: workflow closed; freed its rollout states",
            extra={"workflow_id": workflow_id, "state_keys": [k for _, k in states]},
        )

    await asyncio.gather(*(check(w, s) for w, s in by_workflow.items()))
    return freed


async def moved(client: Client, workflow_id: str, held_key: str, node_queue: str | None = None) -> bool | None:
    """Whether the rollout holding state `held_key` here was initialised again since (None: cannot tell now).

    The rollout's latest `init_rollout` is found by reading its history backwards: a later
    incarnation's state key differs from `held_key`. The same incarnation may have been initialised
    elsewhere too: an init this node started just before it was cut off times out on the server and
    is retried on another node under the same state key. So with `node_queue` (this node's), a
    latest init that completed names the node that holds the rollout now, and one still in flight
    cannot tell yet.
    """
    token = b""
    completed: dict[int, Any] = {}  # scheduled event id -> the result payloads, of the completions seen so far
    try:
        while True:
            page = await client.workflow_service.get_workflow_execution_history_reverse(
                GetWorkflowExecutionHistoryReverseRequest(
                    namespace=client.namespace,
                    execution=WorkflowExecution(workflow_id=workflow_id),
                    maximum_page_size=HISTORY_PAGE,
                    next_page_token=token,
                )
            )
            for event in page.history.events:
                if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    done = event.activity_task_completed_event_attributes
                    completed[done.scheduled_event_id] = done.result.payloads
                    continue
                if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    continue
                attributes = event.activity_task_scheduled_event_attributes
                if attributes.activity_type.name != "init_rollout":
                    continue
                [latest] = await client.data_converter.decode(attributes.input.payloads, [InitRolloutInput])
                if state_key(latest.rollout_id, latest.incarnation) != held_key:
                    return True
                if node_queue is None:
                    return False
                if event.event_id not in completed:
                    return None  # this incarnation's init still runs, here or (retried) elsewhere
                [handle] = await client.data_converter.decode(completed[event.event_id], [RolloutHandle])
                return handle.node_queue != node_queue
            token = page.next_page_token
            if not token:
                return False
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return True
        log.debug("cannot read history", extra={"workflow_id": workflow_id, "error": str(exc)})
        return None


async def reap_moved(client: Client, env: EnvActivities) -> tuple[list[str], int]:
    """Free every rollout state of `env` whose rollout was initialised again elsewhere.

    Returns:
        The keys freed, and how many held states could not be decided now (ask again later).
    """
    semaphore = asyncio.Semaphore(DESCRIBE_CONCURRENCY)
    freed: list[str] = []
    undecided = 0

    async def check(name: str, key: str, workflow_id: str) -> None:
        nonlocal undecided
        async with semaphore:
            gone = await moved(client, workflow_id, key, env.node_queue)
        if gone is None:
            undecided += 1
        if not gone:
            return
        try:
            await env.release(name, key)
        except Exception:  # the next round retries
            log.warning("reaper: release failed", extra={"state_key": key, "env": name}, exc_info=True)
            undecided += 1
            return
        freed.append(key)

    await asyncio.gather(*(check(name, key, w) for (name, key), w in env.held().items()))
    if freed:
        log.warning("reaper: rollouts moved to other nodes while this one was cut off; freed their states",
                    extra={"state_keys": freed})  # fmt: skip
    return freed, undecided


async def fence(env: EnvActivities, out_for_s: float) -> list[str]:
    """Free every rollout state this node holds (no contact with the server for `out_for_s`)."""
    freed = []
    for name, key in env.held():
        try:
            await env.release(name, key)
        except Exception:
            log.warning("fence: release failed", extra={"state_key": key, "env": name}, exc_info=True)
            continue
        freed.append(key)
    if freed:
        log.warning("fence: no contact with the Temporal server; freed every rollout state this node held",
                    extra={"out_for_s": round(out_for_s, 1), "state_keys": freed})  # fmt: skip
    return freed


@dataclass
class Contact:
    """When the server last answered this node, and whether a probe failed since."""

    last: float = field(default_factory=time.monotonic)
    lost: bool = False
    rechecks: int = 0
    """Rounds of `reap_moved` since contact came back (it asks again while some state is undecided)."""

    async def probe(self, client: Client) -> bool:
        """Ask the server something cheap; True if it answered."""
        try:
            # Bounded here too: while the client reconnects to an unreachable host, a call can wait on
            # the connection (a TCP connect gives up after ~2 min) past its own deadline.
            await asyncio.wait_for(
                client.workflow_service.get_system_info(GetSystemInfoRequest(), timeout=PROBE_TIMEOUT),
                PROBE_TIMEOUT.total_seconds() + 1,
            )
        except Exception:  # unreachable, timed out, refused: no contact, whatever the cause
            self.lost = True
            return False
        self.last = time.monotonic()
        return True


async def run_reaper(
    client: Client,
    env: EnvActivities,
    *,
    workspace_root: Path,
    interval_s: float,
    fence_after_s: float | None = None,
    runtimes: NodeRuntimes | None = None,
) -> None:
    """Reap closed rollouts (and dead workers' orphans and containers) every `interval_s`, probe the
    server every `PROBE_S`, free moved rollouts after a lost contact and everything after
    `fence_after_s` without one; until cancelled."""
    await _reap_containers(runtimes)
    contact = Contact()
    tick = min(interval_s, PROBE_S)
    next_reap = time.monotonic() + interval_s
    fenced = False
    while True:
        await asyncio.sleep(tick)
        try:
            if await contact.probe(client):
                if contact.lost:  # back in contact: free what moved meanwhile (asking again what it cannot tell yet)
                    fenced = False
                    contact.rechecks += 1
                    _, undecided = await asyncio.wait_for(reap_moved(client, env), ROUND_TIMEOUT_S)
                    if not undecided or contact.rechecks >= MOVED_RECHECKS:
                        contact.lost, contact.rechecks = False, 0
                if time.monotonic() >= next_reap:
                    await asyncio.wait_for(reap_closed(client, env), ROUND_TIMEOUT_S)
                    await asyncio.to_thread(reap_orphans, workspace_root)
            else:
                out_for = time.monotonic() - contact.last
                if fence_after_s is not None and out_for >= fence_after_s and not fenced:
                    fenced = bool(await fence(env, out_for)) or fenced
        except Exception:  # the reaper must outlive any one bad round
            log.warning("reaper round failed", exc_info=True)
        if time.monotonic() >= next_reap:  # containers are this host's own business: with or without contact
            next_reap = time.monotonic() + interval_s
            await _reap_containers(runtimes)


async def _reap_containers(runtimes: NodeRuntimes | None) -> None:
    if runtimes is None:
        return
    try:
        removed = await runtimes.reap()
    except Exception:  # an engine hiccup: the next round asks again
        log.warning("reaper: container round failed", exc_info=True)
        return
    if removed:
        log.warning("reaper: removed orphaned containers", extra={"containers": removed})
