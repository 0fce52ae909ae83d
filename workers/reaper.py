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
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities.env import EnvActivities
from gymflow.envs.mcp.ledger import reap_orphans
from gymflow.envs.runtime.node import NodeRuntimes

log = logging.getLogger(__name__)

DESCRIBE_CONCURRENCY = 16
"""Describe calls in flight at once, per worker."""


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


async def run_reaper(
    client: Client,
    env: EnvActivities,
    *,
    workspace_root: Path,
    interval_s: float,
    runtimes: NodeRuntimes | None = None,
) -> None:
    """Reap closed rollouts (and dead workers' orphans) every `interval_s` until cancelled."""
    await _reap_containers(runtimes)
    while True:
        await asyncio.sleep(interval_s)
        try:
            await reap_closed(client, env)
            await asyncio.to_thread(reap_orphans, workspace_root)
        except Exception:  # the reaper must outlive any one bad round
            log.warning("reaper round failed", exc_info=True)
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
