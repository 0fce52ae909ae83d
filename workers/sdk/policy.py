"""A trainer's policy version, as its rollouts see it: new groups start on it, running ones are told.

    policy = PolicyChannel(client, ModelConfig(base_url=url, model="step-0", version=0))
    async for group in rollout_groups(client, tasks, env="math", n=8, policy=policy, max_staleness=1):
        ...                                                    # train on it
    await policy.announce(1, model=ModelConfig(base_url=url, model="step-1"))   # the new weights serve

`announce` is durable: every running group of the trainer gets a `names.POLICY_SIGNAL` signal and
passes it to its rollouts, which move to the new version at their next turn boundary (or, with
`RolloutOptions.policy_mode="drain"`, finish the turn they are in and wait there while an
announcement is pending: `announce(v, live=False)` first, then `announce(v)` once the weights are
loaded). Groups started later begin with the newest announcement in their input. Every model turn
records the version that played it (`Trajectory.versions`).
"""

from __future__ import annotations

import asyncio
import contextlib

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities import names
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import PolicyUpdate

GONE = frozenset({RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION})
"""What signalling a group that closed meanwhile answers: nothing to tell it."""


class PolicyChannel:
    """The trainer's current policy (a versioned `ModelConfig`) and the groups playing it.

    Args:
        client: The Temporal client the groups were started with.
        model: The starting policy; its `version` (0 when unset) is the current version.
    """

    def __init__(self, client: Client, model: ModelConfig) -> None:
        self.client = client
        self.model = model if model.version is not None else model.model_copy(update={"version": 0})
        self.pending: PolicyUpdate | None = None
        """An announced version not live yet (`announce(..., live=False)`)."""
        self._running: dict[str, int] = {}
        """Running group id -> the newest announcement it has (its version, pending ones counted)."""

    @property
    def version(self) -> int:
        """The live policy version."""
        assert self.model.version is not None
        return self.model.version

    def latest(self) -> PolicyUpdate | None:
        """What a group starting now must be told beyond its model: a pending announcement, if any."""
        return self.pending

    async def announce(self, version: int, *, live: bool = True, model: ModelConfig | None = None) -> int:
        """Tell the trainer's running groups (and through them their rollouts) about `version`;
        returns how many groups were told.

        Raises:
            ValueError: `version` is older than the live one (a trainer's versions only grow).
        """
        if version < self.version or (version == self.version and not live):
            raise ValueError(f"policy version {version} is not newer than the live version {self.version}")
        update = PolicyUpdate(version=version, live=live, model=model)
        if live:
            self.model = (model or self.model).model_copy(update={"version": version})
            self.pending = None
        else:
            self.pending = update
        told = await asyncio.gather(*(self._tell(group_id, update) for group_id in list(self._running)))
        return sum(told)

    def stamp(self) -> int:
        """A number that grows with every announcement (a pending version, then the same version live)."""
        return self._stamp()

    def started(self, group_id: str, since: int) -> None:
        """A group of this channel's began, with the model and announcement current at `since` (`stamp()`)."""
        self._running[group_id] = since

    async def caught_up(self, group_id: str, since: int) -> None:
        """Tell a group that just started what was announced after its input was made (at `since`)."""
        if self._stamp() > since:
            update = self.pending or PolicyUpdate(version=self.version, model=self.model)
            await self._tell(group_id, update)

    def finished(self, group_id: str) -> None:
        self._running.pop(group_id, None)

    async def cancel_running(self) -> int:
        """Cancel the groups still playing (a trainer that took every step it wanted); returns how many."""

        async def cancel(group_id: str) -> bool:
            try:
                await self.client.get_workflow_handle(group_id).cancel()
            except RPCError as exc:
                if exc.status not in GONE:
                    raise
                return False
            return True

        return sum(await asyncio.gather(*(cancel(group_id) for group_id in list(self._running))))

    def _stamp(self) -> int:
        """A number that grows with every announcement (live versions and pending ones)."""
        if self.pending is not None:
            return 2 * self.pending.version - 1
        return 2 * self.version

    async def _tell(self, group_id: str, update: PolicyUpdate) -> bool:
        try:
            await self.client.get_workflow_handle(group_id).signal(names.POLICY_SIGNAL, update)
        except RPCError as exc:
            if exc.status not in GONE:
                raise
            self._running.pop(group_id, None)
            return False
        with contextlib.suppress(KeyError):
            self._running[group_id] = max(self._running[group_id], self._stamp())
        return True
