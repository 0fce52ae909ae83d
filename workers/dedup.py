"""At most one execution of an env activity per node: a retry of a completed attempt gets its result.

Temporal runs activities at least once. An attempt can finish its work and then fail to report
it: the Temporal server is down or restarting, the connection drops. The server later times the
attempt out and retries it — on the same node queue, so on the same live MCP server. A stateful
tool would then run twice (a counter incremented twice) and the rollout would be scored on wrong
state without anyone noticing: a silent wrong reward, found by tests/chaos/test_server_restart.py.

This worker interceptor remembers, per node, the results of the env activities that completed
here, keyed by (workflow id, run id, activity id) — which stays the same across the retries of one
activity and differs for every new call, replay or recovery. A retry of a completed attempt returns
the remembered result without running the tool again; a retry that arrives while the first attempt
is still running waits for it. Entries of a rollout are dropped when its `release_rollout`
completes here (its state is gone, nothing can be retried against it), with a size cap and an age
limit as backstops. A node that died takes its memory with it, and with it the rollout's state:
that case is recovery's (RolloutNotFound, then replay), not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

log = logging.getLogger(__name__)

Key = tuple[str, str, str]
"""(workflow id, run id, activity id)"""
MAX_ENTRIES = 10_000
"""Results kept at most (the oldest go first)."""
MAX_AGE_S = 6 * 3600.0
"""Results older than this are forgotten (a rollout that never released its state)."""
RELEASE = "release_rollout"


class CompletedActivities:
    """Results of the activities this node completed, kept while their rollout lives."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_age_s: float = MAX_AGE_S) -> None:
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self._done: OrderedDict[Key, tuple[float, Any]] = OrderedDict()
        self._running: dict[Key, asyncio.Future[Any]] = {}
        self.duplicates = 0
        """Retries answered from memory instead of running again."""

    def __len__(self) -> int:
        return len(self._done)

    def result(self, key: Key) -> tuple[bool, Any]:
        """(True, result) if `key` completed here and is still remembered."""
        entry = self._done.get(key)
        if entry is None:
            return False, None
        if time.monotonic() - entry[0] > self.max_age_s:
            del self._done[key]
            return False, None
        return True, entry[1]

    def remember(self, key: Key, result: Any) -> None:
        self._done[key] = (time.monotonic(), result)
        self._done.move_to_end(key)
        while len(self._done) > self.max_entries:
            self._done.popitem(last=False)

    def forget_run(self, workflow_id: str, run_id: str) -> None:
        """Drop every entry of one workflow run (its rollout released its state on this node)."""
        for key in [k for k in self._done if k[0] == workflow_id and k[1] == run_id]:
            del self._done[key]


class DedupInterceptor(Interceptor):
    """Install on the worker of a node queue: `Worker(..., interceptors=[DedupInterceptor()])`.

    Args:
        activity_types: The activities deduplicated (default: all on that worker).
        store: Where results are kept (tests pass their own to look inside).
    """

    def __init__(
        self, activity_types: Iterable[str] | None = None, *, store: CompletedActivities | None = None
    ) -> None:
        self.activity_types = set(activity_types) if activity_types is not None else None
        self.store = store if store is not None else CompletedActivities()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, owner: DedupInterceptor) -> None:
        super().__init__(next)
        self.owner = owner

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        types = self.owner.activity_types
        if types is not None and info.activity_type not in types and info.activity_type != RELEASE:
            return await self.next.execute_activity(input)
        store = self.owner.store
        key = (info.workflow_id or "", info.workflow_run_id or "", info.activity_id)
        done, result = store.result(key)
        if done:
            store.duplicates += 1
            log.warning("activity already completed on this node; returning its result instead of running it again")
            return result
        running = store._running.get(key)
        if running is not None:  # an earlier attempt is still at work here: its outcome is this one's
            with contextlib.suppress(Exception):
                result = await asyncio.shield(running)
                store.duplicates += 1
                return result
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        store._running[key] = future
        try:
            result = await self.next.execute_activity(input)
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            future.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            if store._running.get(key) is future:
                del store._running[key]
        future.set_result(result)
        if info.activity_type == RELEASE:
            store.forget_run(key[0], key[1])
        elif types is None or info.activity_type in types:
            store.remember(key, result)
        return result
