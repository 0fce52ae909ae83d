"""A warm pool of started ServerSets, so a rollout's init takes a ready one in milliseconds.

Starting an MCP server process (an interpreter, imports, the handshake) is most of a rollout's init, so
each env instance keeps `size` sets started ahead of demand, each in its own fresh workspace.
`acquire` hands out the oldest live one and refills in the background; with none ready it starts
one on the spot (a cold start), so the pool only ever saves time. A pooled set is never reused:
release destroys it, which is what keeps rollouts isolated.

A pooled server that dies while waiting is noticed at once (each set's `wait_ended`) and
replaced. A server that keeps failing must not turn the refill into a crash loop: after
`MAX_CONSECUTIVE_FAILURES` failed or dead-on-arrival starts, refilling pauses until the next
`acquire`, whose cold start then reports the real error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from gymflow.envs.mcp.instance import ServerSet

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3


class WarmPool:
    """Keeps `size` ServerSets started; size 0 means every acquire is a cold start."""

    def __init__(
        self,
        *,
        size: int,
        start: Callable[[], Awaitable[ServerSet]],
        stop: Callable[[ServerSet], Awaitable[None]],
    ) -> None:
        if size < 0:
            raise ValueError(f"pool_size must be >= 0, got {size}")
        self.size = size
        self._start = start
        self._stop = stop
        self._ready: list[ServerSet] = []
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting = 0
        self._failures = 0
        self._closed = False
        self._changed = asyncio.Event()

    @property
    def ready(self) -> int:
        """Started sets waiting for a rollout."""
        return len(self._ready)

    async def acquire(self) -> ServerSet:
        """A live ServerSet: a pooled one if any is ready, else a freshly started one."""
        self._failures = 0
        while self._ready:
            sset = self._ready.pop(0)
            self._unwatch(sset)
            if sset.alive:
                self._refill()
                return sset
            await self._stop(sset)
        self._refill()
        return await self._start()

    async def warm(self, timeout_s: float = 60.0) -> None:
        """Fill the pool now and wait until it is full, or refilling has given up after repeated failures."""
        deadline = time.monotonic() + timeout_s
        self._failures = 0
        while len(self._ready) < self.size:
            if not self._starting:
                if self._failures >= MAX_CONSECUTIVE_FAILURES:
                    return
                self._refill()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"warm pool not full after {timeout_s}s ({len(self._ready)}/{self.size})")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def close(self) -> None:
        """Stop refilling and stop every pooled set."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        ready, self._ready = self._ready, []
        for sset in ready:
            self._unwatch(sset)
        await asyncio.gather(*(self._stop(s) for s in ready), return_exceptions=True)

    def _refill(self) -> None:
        if self._closed or self._failures >= MAX_CONSECUTIVE_FAILURES:
            return
        for _ in range(self.size - len(self._ready) - self._starting):
            self._starting += 1
            self._spawn(self._fill_one())

    async def _fill_one(self) -> None:
        try:
            sset = await self._start()
        except Exception as exc:  # a refill failure must not kill the pool; acquire reports it
            self._failures += 1
            log.warning("warm pool could not start a server set", extra={"error": str(exc)})
        else:
            if self._closed:
                await self._stop(sset)
                return
            self._ready.append(sset)
            self._watchers[sset.entry] = self._spawn(self._watch(sset))
        finally:
            self._starting -= 1
            self._changed.set()

    async def _watch(self, sset: ServerSet) -> None:
        await sset.wait_ended()
        if sset in self._ready:  # died while pooled: replace it
            self._ready.remove(sset)
            self._watchers.pop(sset.entry, None)
            self._failures += 1
            log.warning("pooled MCP server set died before use; replacing it")
            await self._stop(sset)
            self._refill()
            self._changed.set()

    def _unwatch(self, sset: ServerSet) -> None:
        watcher = self._watchers.pop(sset.entry, None)
        if watcher is not None:
            watcher.cancel()

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
