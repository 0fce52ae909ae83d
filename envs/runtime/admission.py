"""Node-level admission control: how much expensive env work one worker runs at once.

A worker node runs its workflow tasks, heartbeats and every env step of its rollouts on one
machine. Offered more work than its cores can do, everything slows down together: 64 MCP
servers starting at once each get 1/32 of a core and miss their handshake timeout, sandboxed
code runs hit their wall limits, and the worker's own event loop (which sends heartbeats and
completes workflow tasks) gets a sliver of the CPU, so healthy activities time out and are
retried, adding more load. Admission turns that collapse into a queue:

* Three kinds of expensive step have their own slots: ``start`` (starting a server process
  and its MCP handshake), ``run`` (a tool call of a CPU-bound env: sandboxed code) and
  ``reward`` (a CPU-bound env's reward: a sandboxed recalculation). Waits are FIFO.
* A step's own clock starts when it is admitted: the MCP handshake timeout and a tool's
  timeout never count the time spent waiting for a slot. Activities keep heartbeating while
  they wait (`gymflow.activities.env`), so a queued step is never taken for a hung one.
* Slots are sized from the machine (`Capacity.detect`: usable cores, available memory), and
  overridable by settings (`gymflow.workers.config`).
* Processes the node starts for env work (MCP servers and, through them, sandboxed runs) run
  at a lower CPU priority (`nice`), so the worker and the Temporal server are never starved by
  the work they schedule.
* CPU-bound Python helpers (openpyxl, dataset generation) run in a small process pool: a thread
  would hold the GIL that the worker's event loop and workflow activations need.

This module is plain asyncio; the env contract stays free of temporalio.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from gymflow.envs.errors import InfraError, UserError

T = TypeVar("T")
Step = Literal["start", "run", "reward"]

DEFAULT_NICE = 5
"""Niceness added to env processes (servers, sandboxed runs): below the worker, never starved."""
ROLLOUT_MEMORY_MB = 192
"""Memory one in-flight rollout may hold (an MCP server process and its workspace), for the window."""


def usable_cpus() -> int:
    """Cores this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_memory_mb() -> int | None:
    """MemAvailable from /proc/meminfo in MB, None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Capacity:
    """How many expensive steps a node runs at once, and the batch window it can hold."""

    starts: int
    """Server starts (process + MCP handshake) at once."""
    runs: int
    """Tool calls of CPU-bound envs (sandboxed code) at once."""
    rewards: int
    """Rewards of CPU-bound envs at once."""
    cpu_workers: int
    """Processes of the pool for CPU-bound helpers."""
    window: int
    """Rollouts in flight that this node holds comfortably (default batch window)."""

    @classmethod
    def detect(cls, *, cpus: int | None = None, memory_mb: int | None = None) -> Capacity:
        """Capacity of this machine (or of `cpus` cores and `memory_mb` of available memory).

        A server start or a sandboxed run is about one core-second of Python, so each kind gets
        about one slot per core; runs get two per core since part of a run is I/O and process
        setup. The window keeps every core busy through model latency (16 rollouts per core), and
        never more than the memory holds.
        """
        cpus = cpus or usable_cpus()
        memory_mb = memory_mb if memory_mb is not None else available_memory_mb()
        window = 16 * cpus
        if memory_mb is not None:
            window = min(window, max(4, memory_mb // 2 // ROLLOUT_MEMORY_MB))
        return cls(
            starts=cpus,
            runs=2 * cpus,
            rewards=cpus,
            cpu_workers=max(1, min(cpus, 4)),
            window=max(4, window),
        )


class Admission:
    """Slots for a node's expensive steps, and its pool for CPU-bound helpers.

    One instance per worker, shared by every env instance and activity of the node.
    """

    def __init__(self, capacity: Capacity | None = None, *, nice: int = DEFAULT_NICE) -> None:
        self.capacity = capacity or Capacity.detect()
        self.nice = nice
        self._slots = {
            "start": asyncio.Semaphore(self.capacity.starts),
            "run": asyncio.Semaphore(self.capacity.runs),
            "reward": asyncio.Semaphore(self.capacity.rewards),
        }
        self._limits = {"start": self.capacity.starts, "run": self.capacity.runs, "reward": self.capacity.rewards}
        self._waiting = dict.fromkeys(self._slots, 0)
        self._pool: ProcessPoolExecutor | None = None
        self.on_admitted: Callable[[Step, float], None] | None = None
        """Told each admission's step and the seconds it waited (the worker's metrics)."""

    @contextlib.asynccontextmanager
    async def slot(self, step: Step) -> AsyncIterator[None]:
        """Hold one slot of `step` for the block; waits (FIFO) while all are taken."""
        semaphore = self._slots[step]
        self._waiting[step] += 1
        queued = time.monotonic()
        try:
            await semaphore.acquire()
        finally:
            self._waiting[step] -= 1
        if self.on_admitted is not None:
            self.on_admitted(step, time.monotonic() - queued)
        try:
            yield
        finally:
            semaphore.release()

    def stats(self) -> dict[str, dict[str, int]]:
        """Per step: slots, in use, waiting (for logs and tests)."""
        return {
            step: {
                "slots": self._limits[step],
                "busy": self._limits[step] - sem._value,
                "waiting": self._waiting[step],
            }
            for step, sem in self._slots.items()
        }

    async def cpu(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in the node's process pool, or in a thread when it cannot run there.

        Functions and arguments travel by pickle: module-level functions and classes of importable
        modules, plain data. Anything that cannot (a class made at run time from an env file, one
        defined in a module the pool cannot import) runs in a thread instead.
        """
        try:
            blob = pickle.dumps((fn, args, kwargs))
        except (pickle.PicklingError, TypeError, AttributeError):
            return await asyncio.to_thread(fn, *args, **kwargs)
        if self._pool is None:
            # spawn, not fork: the worker has threads (the SDK's core), which fork would copy mid-lock.
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.capacity.cpu_workers,
                mp_context=context,
                initializer=_init_worker,
                initargs=(self.nice, os.getpid()),
            )
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(self._pool, _call, blob)
        except UserError as exc:
            # The pool chains the child's traceback as the cause; an expected error's message says
            # it all, and that traceback would otherwise become the message users read.
            exc.__cause__, exc.__suppress_context__ = None, True
            raise
        except BrokenProcessPool as exc:
            # A broken pool fails every call after it: the next call starts a fresh one.
            self.shutdown()
            raise InfraError(POOL_BROKEN) from exc
        if isinstance(outcome, _Unloadable):
            return await asyncio.to_thread(fn, *args, **kwargs)
        return cast(T, outcome)

    def shutdown(self) -> None:
        """Stop the process pool (worker exit): calls not started are dropped, running ones finish.

        Waiting releases the pool's semaphores before the process ends: the CLI leaves without the
        interpreter's teardown (gymflow.workers.cli.exits), and a pool left winding down then makes
        multiprocessing's resource tracker warn of leaked semaphores on the command's stderr.
        """
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


POOL_BROKEN = (
    "the node's process pool stopped: one of its processes died (killed, or out of memory), or the "
    "program that started gymflow runs its code when imported. The pool's processes start by importing "
    "the program's main module, so a script that runs an eval, a batch or a worker must do it under "
    '`if __name__ == "__main__":`'
)
"""Why a call failed when the pool broke under it (an InfraError: the rollout is recovered or flagged)."""


class _Unloadable:
    """What the pool answers for a call it could not unpickle (the caller runs it in a thread)."""


def _call(blob: bytes) -> Any:
    try:
        fn, args, kwargs = pickle.loads(blob)
    except Exception:  # e.g. a class of a module only the worker's sys.path holds
        return _Unloadable()
    return fn(*args, **kwargs)


def _init_worker(nice: int, parent: int) -> None:
    with contextlib.suppress(OSError):
        os.nice(nice)
    # A worker killed outright (SIGKILL, OOM) never shuts its pool down: its processes leave with it.
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="gymflow-pool-parent").start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)
