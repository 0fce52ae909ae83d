"""Worker processes per node: `gymflow worker --processes N|auto` (`GYMFLOW_WORKER_PROCESSES`).

One worker process runs its workflow activations and the Python of every activity on one core
(the GIL). With `--processes N` (N > 1; `auto`: one per usable core, the count admission control
sizes its slots from, `gymflow.envs.runtime.admission.usable_cpus`) `gymflow worker` becomes a small supervisor
of N full workers on the same shared queue. Each child is a fresh interpreter
(`python -m gymflow.workers.cli.main worker`), never a fork of a running process: the SDK's Rust core threads
and an event loop do not survive `fork`.

Each child is a node of its own: node id `<node_id>-p<i>` and so its own node queue
`<task_queue>@<node_id>-p<i>` (the rollouts it initialises stay pinned to it) and its own
workspace directory `<workspace_root>/<node_id>-p<i>`. A restarted child gets a new node id
(`<node_id>-p<i>-r<k>`), exactly as a restarted worker does: it does not hold the rollouts of the
one that died, whose env activities then miss their schedule-to-start timeout and the rollouts
re-initialise on a live node (the node-loss path of DESIGN.md).

The node's admission capacity (server starts, CPU-bound tool runs and rewards, the CPU helper pool),
its MCP warm pool (at least 1 per child when the pool is on) and its workflow task slots are
**partitioned, not shared**: each child gets a 1/N share (at least 1), so N children together admit
what one process would. They cannot be shared: an MCP stdio server is a child process of the
worker that started it, talking over that process's pipes, so a warm server or a started one can
only ever serve rollouts of its own worker, and a semaphore across processes would put a
cross-process lock on every env step. Memory enters only the batch window of clients
(`Capacity.window`), not a worker's slots. When a child dies, what it held (MCP server processes,
workspaces) is freed by the orphan reaper (`gymflow.envs.mcp.ledger.reap_orphans`): every child runs it at
start and every reaper round (`gymflow.workers.reaper`), so the restarted child or any sibling frees it.

The supervisor forwards SIGINT/SIGTERM to its children and waits for their graceful shutdown
(SIGKILL after `STOP_TIMEOUT_S`). A child that dies unexpectedly is restarted after a bounded
backoff (one structured log line per restart); a child that crashes within `START_GRACE_S` of its
start `MAX_START_FAILURES` times in a row (a bad address, a broken install) makes the supervisor
stop the others and exit 1 with a clear message instead of looping forever. Children log their
own lines (with their node id) to the supervisor's stderr; on Linux they get SIGTERM if the
supervisor itself dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gymflow.workers.config import Settings

log = logging.getLogger(__name__)

AUTO = "auto"
START_GRACE_S = 10.0
"""A child that exits sooner than this after its start crashed at start."""
MAX_START_FAILURES = 3
"""Crashes at start in a row (of one child) after which the supervisor gives up."""
BACKOFF_S = 0.5
"""Delay before the first restart of a child; doubled per crash at start in a row."""
MAX_BACKOFF_S = 30.0
"""The longest delay before a restart."""
STOP_TIMEOUT_S = 60.0
"""How long children get to shut down gracefully after SIGTERM before they are killed."""


def parse_processes(text: str) -> int | Literal["auto"]:
    """`--processes` value: a positive integer or `auto`; ValueError with a clear message otherwise."""
    value = text.strip().lower()
    if value == AUTO:
        return "auto"
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"--processes must be a positive integer or 'auto', not {text!r}")
    return int(value)


def child_node_id(node_id: str, index: int, restart: int = 0) -> str:
    """Node id of child `index` (`<node_id>-p<i>`), `-r<k>` after its k-th restart."""
    return f"{node_id}-p{index}" + (f"-r{restart}" if restart else "")


def share(total: int, count: int) -> int:
    """A 1/count share of `total` slots, at least 1."""
    return max(1, total // count)


def child_environment(settings: Settings, *, node_id: str, count: int, index: int = 0) -> dict[str, str]:
    """Variables of a child: the supervisor's resolved settings and connection, its node id, its share.

    The connection the supervisor resolved (its flags included: --profile, --api-key, --tls-*)
    goes as GYMFLOW_TEMPORAL_ADDRESS / GYMFLOW_NAMESPACE and TEMPORAL_* variables (gymflow.workers.connection),
    and `metrics_port` as port + index (child i serves its own /metrics). Everything else
    (keys, storage, timeouts) the child reads from the environment it inherits, as the supervisor did.
    """
    capacity = settings.capacity()
    connection = settings.temporal_connection()
    values: dict[str, object] = {
        "temporal_address": connection.address,
        "namespace": connection.namespace,
        "task_queue": settings.task_queue,
        "data_dir": settings.data_dir,
        "workspace_root": settings.workspace_root,
        "ui_port": settings.ui_port,
        "node_id": node_id,
        "worker_processes": 1,
        "worker_roles": ",".join(settings.worker_roles),
        "max_server_starts": share(capacity.starts, count),
        "max_tool_runs": share(capacity.runs, count),
        "max_rewards": share(capacity.rewards, count),
        "cpu_workers": share(capacity.cpu_workers, count),
        "mcp_pool_size": share(settings.mcp_pool_size, count) if settings.mcp_pool_size else 0,
        "max_concurrent_workflow_tasks": share(settings.workflow_task_slots, count),
        "metrics_port": None if settings.metrics_port is None else settings.metrics_port + index,
    }
    gymflow = {f"GYMFLOW_{key.upper()}": str(value) for key, value in values.items() if value is not None}
    return {**connection.environment(), **gymflow}


def worker_command(*, log_format: str = "auto", verbose: bool = False) -> list[str]:
    """The command of a child: `gymflow worker` in a fresh interpreter, logging as the supervisor."""
    return [
        sys.executable,
        "-m",
        "gymflow.workers.cli",
        "--log-format",
        log_format,
        *(["-v"] if verbose else []),
        "worker",
    ]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # PR_SET_PDEATHSIG: SIGTERM (a graceful stop) to the child if the supervisor dies, even by SIGKILL.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))


@dataclass
class Child:
    """One worker process slot of the supervisor."""

    index: int
    process: asyncio.subprocess.Process | None = None
    node_id: str = ""
    started_at: float = 0.0
    restarts: int = 0
    start_failures: int = 0
    """Crashes within START_GRACE_S of the start, in a row."""


@dataclass
class Supervisor:
    """Runs `count` worker children until SIGINT/SIGTERM; restarts those that die."""

    settings: Settings
    count: int
    command: Sequence[str] = field(default_factory=worker_command)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    start_grace_s: float = START_GRACE_S
    max_start_failures: int = MAX_START_FAILURES
    stop_timeout_s: float = STOP_TIMEOUT_S
    children: list[Child] = field(init=False)
    _stop: asyncio.Event = field(init=False, default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.children = [Child(i) for i in range(self.count)]

    async def run(self) -> int:
        """Supervise until stopped (0) or until a child keeps crashing at start (1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        log.info("worker supervisor", extra={"node": self.settings.node_id, "processes": self.count})
        try:
            await asyncio.gather(*(self._start(child) for child in self.children))
            watchers = {asyncio.ensure_future(self._watch(child)) for child in self.children}
            stopping = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait([*watchers, stopping], return_when=asyncio.FIRST_COMPLETED)
            failed = [w.result() for w in done if w is not stopping and w.result() is not None]
            for watcher in watchers:
                watcher.cancel()
            stopping.cancel()
            if failed:
                print(f"gymflow worker: {failed[0]}", file=sys.stderr)
                return 1
            return 0
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self._stop_children()

    async def _start(self, child: Child) -> None:
        child.node_id = child_node_id(self.settings.node_id, child.index, child.restarts)
        own = child_environment(self.settings, node_id=child.node_id, count=self.count, index=child.index)
        environ = {**self.environ, **own}
        child.process = await asyncio.create_subprocess_exec(
            *self.command, env=environ, preexec_fn=_die_with_parent if sys.platform == "linux" else None
        )
        child.started_at = time.monotonic()
        log.info("worker process started", extra={"node": child.node_id, "pid": child.process.pid})

    async def _watch(self, child: Child) -> str | None:
        """Restart `child` whenever it exits; returns why to give up, if it keeps crashing at start."""
        while True:
            assert child.process is not None
            code = await child.process.wait()
            if self._stop.is_set():
                return None
            ran_s = time.monotonic() - child.started_at
            child.start_failures = child.start_failures + 1 if ran_s < self.start_grace_s else 0
            if child.start_failures >= self.max_start_failures:
                return (
                    f"worker process {child.index} exited {child.start_failures} times in a row within "
                    f"{self.start_grace_s:g} s of starting (last exit code {code}); giving up. "
                    "Its log lines above say why (e.g. an unreachable --address)."
                )
            delay = min(MAX_BACKOFF_S, BACKOFF_S * 2 ** max(0, child.start_failures - 1))
            log.warning(
                "worker process exited; restarting",
                extra={
                    "node": child.node_id,
                    "pid": child.process.pid,
                    "exit_code": code,
                    "ran_s": round(ran_s, 1),
                    "restart_in_s": delay,
                    "restarts": child.restarts + 1,
                },
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stop.is_set():
                return None
            child.restarts += 1
            await self._start(child)

    async def _stop_children(self) -> None:
        running = [c.process for c in self.children if c.process is not None and c.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), self.stop_timeout_s)
        except TimeoutError:
            for process in running:
                if process.returncode is None:
                    log.warning("worker process did not stop in time; killing it", extra={"pid": process.pid})
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.gather(*(p.wait() for p in running))


async def supervise(settings: Settings, *, command: Sequence[str] | None = None) -> int:
    """Run `settings.process_count` worker processes until SIGINT/SIGTERM; the exit code."""
    supervisor = Supervisor(settings, settings.process_count)
    if command is not None:
        supervisor.command = command
    return await supervisor.run()
