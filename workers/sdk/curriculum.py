"""Which GRPO groups are worth training on, and which tasks are worth asking again.

A GRPO group whose scored samples all got the same reward has every advantage 0: it costs a
trainer a forward and backward pass and teaches nothing. With a `DifficultyFilter`,
`gymflow.workers.sdk.groups.rollout_groups` drops such groups as they finish and starts the next
task in their place, so a step that asks for `want=K` groups receives K groups with signal (or is
told, in the call's `GroupStats`, why it got fewer).

A `TaskPool` remembers, per task, the outcomes of its last groups, and retires a task that was
solved (or failed) by every one of its last R groups: later calls pass over it without starting
it. It is a plain pydantic model, so a trainer saves it with its checkpoint (`model_dump_json`)
and a restarted trainer resumes it (`model_validate_json`).

Design decisions:

* Rewards are read from `GroupResult.rewards` (after any group reward), ignoring infra-failed
  samples (None). A group with no scored sample at all is `infra_failed`: dropped whenever a filter
  is on, never an observation of the task's difficulty.
* The outcome of a group (`outcome`) does not depend on what the filter drops: a filter that drops
  only solved groups still tells the pool that a task failed every sample.
* The pool forgets all but the last R outcomes of a task, and remembers which group each came from,
  so reading a resumed batch's groups again does not count them twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

from pydantic import Field, model_validator

from gymflow.activities.schema import GroupResult
from gymflow.envs.contract import Task, Wire

Outcome = Literal["mixed", "solved", "failed", "equal", "infra_failed"]
"""What a finished group says about its task: rewards that differ (`mixed`, the only kind with
signal), every scored sample at the top of the reward range (`solved`) or at its bottom (`failed`),
all equal elsewhere in the range (`equal`), or no scored sample (`infra_failed`)."""
Drop = Literal["equal", "extremes", "solved", "failed"]
DROPPED: dict[Drop, frozenset[Outcome]] = {
    "equal": frozenset({"solved", "failed", "equal"}),
    "extremes": frozenset({"solved", "failed"}),
    "solved": frozenset({"solved"}),
    "failed": frozenset({"failed"}),
}
"""The outcomes each `DifficultyFilter.drop` setting drops (besides `infra_failed`, always dropped)."""
Retired = Literal["solved", "failed"]


class DifficultyFilter(Wire):
    """Which finished groups `rollout_groups` drops (and replaces) instead of yielding.

    The default drops every zero-variance group: all scored samples equal within `tolerance`
    (with rewards in [0, 1]: all solved or all failed).
    """

    drop: Drop = "equal"
    """`equal`: any group whose scored rewards are all equal; `extremes`: only all-solved and
    all-failed groups (a group all at 0.5 is kept); `solved`: only all-solved; `failed`: only
    all-failed. Groups with no scored sample are always dropped."""
    min_reward: float = 0.0
    """The reward of a failed sample: a sample at or below it (within `tolerance`) failed."""
    max_reward: float = 1.0
    """The reward of a solved sample: a sample at or above it (within `tolerance`) is solved."""
    tolerance: float = Field(default=1e-6, ge=0)
    """How far apart two rewards may be and still count as equal."""

    @model_validator(mode="after")
    def _range(self) -> DifficultyFilter:
        if not self.min_reward < self.max_reward:
            raise ValueError(f"min_reward ({self.min_reward}) must be below max_reward ({self.max_reward})")
        if 2 * self.tolerance >= self.max_reward - self.min_reward:
            raise ValueError(
                f"tolerance ({self.tolerance}) must be under half the reward range "
                f"({self.min_reward}..{self.max_reward}): solved and failed would overlap"
            )
        return self

    def outcome(self, rewards: Sequence[float | None]) -> Outcome:
        """What a group with these rewards says about its task (None: an infra-failed sample)."""
        scored = [r for r in rewards if r is not None]
        if not scored:
            return "infra_failed"
        if all(r >= self.max_reward - self.tolerance for r in scored):
            return "solved"
        if all(r <= self.min_reward + self.tolerance for r in scored):
            return "failed"
        return "equal" if max(scored) - min(scored) <= self.tolerance else "mixed"

    def drops(self, outcome: Outcome) -> bool:
        """Whether a group with this outcome is dropped."""
        return outcome == "infra_failed" or outcome in DROPPED[self.drop]


class GroupStats(Wire):
    """What one `rollout_groups` call did, updated as it runs (read it after the stream, or while it runs).

    `scalars()` gives the counts as a trainer's step scalars.
    """

    wanted: int | None = None
    """The call's `want` (None: every task)."""
    tasks_taken: int = 0
    """Tasks read from the task stream (started, skipped or passed over as retired): the stream's
    next task is the one after these."""
    started: int = 0
    """Groups started (or, resuming a batch, attached to or read back)."""
    skipped: int = 0
    """Tasks whose group id was in `skip`."""
    passed_over_retired: int = 0
    """Tasks the pool had retired, not started."""
    yielded: int = 0
    dropped_solved: int = 0
    dropped_failed: int = 0
    dropped_equal: int = 0
    dropped_infra_failed: int = 0
    """Groups dropped because none of their samples was scored."""
    infra_failed_samples: int = 0
    """Infra-failed samples in every group this call received, yielded or dropped."""
    dropped_ids: list[str] = Field(default_factory=list)
    """Ids of the dropped groups: consumed like the yielded ones (pass both in `skip` to leave them out)."""
    retired: list[str] = Field(default_factory=list)
    """Task ids the pool retired during this call."""
    ended: Literal["want", "tasks", "max_replacements"] | None = None
    """Why the call stopped (None while it runs): it had `want` groups; the task stream ran out;
    or it took `want + max_replacements` tasks and yields fewer than `want`."""
    stale_rerun: int = 0
    """Groups too stale to yield (`max_staleness`) whose task was played again."""
    stale_kept: int = 0
    """Groups yielded although stale (`stale="keep"`)."""
    stale_dropped: int = 0
    """Groups dropped as stale (`stale="drop"`, or after `MAX_RERUNS` reruns)."""
    lags: dict[int, int] = Field(default_factory=dict)
    """With a policy: the groups that passed the staleness check, by lag (versions between their oldest
    turn and the live policy)."""

    @property
    def dropped(self) -> int:
        return self.dropped_solved + self.dropped_failed + self.dropped_equal + self.dropped_infra_failed

    @property
    def short(self) -> int:
        """How many groups fewer than `want` the call yielded (0 without `want`)."""
        return 0 if self.wanted is None else max(0, self.wanted - self.yielded)

    def count(self, outcome: Outcome) -> None:
        """Count a dropped group of this outcome."""
        if outcome == "solved":
            self.dropped_solved += 1
        elif outcome == "failed":
            self.dropped_failed += 1
        elif outcome == "equal":
            self.dropped_equal += 1
        elif outcome == "infra_failed":
            self.dropped_infra_failed += 1

    def summary(self) -> str:
        """One line for a trainer's log: `6 yielded, 2 all solved, 1 all failed, ...`."""
        parts = [f"{self.yielded} yielded"]
        for count, what in [
            (self.dropped_solved, "all solved"), (self.dropped_failed, "all failed"),
            (self.dropped_equal, "all equal"), (self.dropped_infra_failed, "infra-failed"),
            (self.passed_over_retired, "retired passed over"), (len(self.retired), "newly retired"),
            (self.short, "short"),
        ]:  # fmt: skip
            if count:
                parts.append(f"{count} {what}")
        if self.ended == "max_replacements":
            parts.append("replacement limit reached")
        return ", ".join(parts)

    def scalars(self, prefix: str = "groups/") -> dict[str, float]:
        """The counts as step scalars (`groups/yielded`, `groups/dropped_solved`, ...)."""
        values = {
            "started": self.started,
            "yielded": self.yielded,
            "dropped_solved": self.dropped_solved,
            "dropped_failed": self.dropped_failed,
            "dropped_equal": self.dropped_equal,
            "dropped_infra_failed": self.dropped_infra_failed,
            "infra_failed_samples": self.infra_failed_samples,
            "passed_over_retired": self.passed_over_retired,
            "retired": len(self.retired),
            "short": self.short,
            "replacement_limit_reached": self.ended == "max_replacements",
            "stale_rerun": self.stale_rerun,
            "stale_kept": self.stale_kept,
            "stale_dropped": self.stale_dropped,
        }
        return {f"{prefix}{name}": float(value) for name, value in values.items()}


class Observation(Wire):
    """One group's outcome for its task, remembered by the pool."""

    group_id: str
    outcome: Outcome


class TaskPool(Wire):
    """Retires tasks that every one of their last R groups solved (or failed); a trainer keeps one across steps.

    Pass it to `rollout_groups(pool=...)`: retired tasks are passed over without being started, and
    every group the call receives (yielded or dropped) is observed. Save it with the trainer's
    checkpoint (`pool.model_dump_json()`) and load it on restart (`TaskPool.model_validate_json`).

        pool = TaskPool(retire_solved_after=3)
    """

    retire_solved_after: int | None = Field(default=None, ge=1)
    """Retire a task once this many of its groups in a row were all solved (None: never)."""
    retire_failed_after: int | None = Field(default=None, ge=1)
    """Retire a task once this many of its groups in a row were all failed (None: never)."""
    history: dict[str, list[Observation]] = Field(default_factory=dict)
    """Per task id, the outcomes of its last groups (as many as the larger of the two settings)."""
    retired: dict[str, Retired] = Field(default_factory=dict)
    """Retired task ids, each with why."""

    @model_validator(mode="after")
    def _something(self) -> TaskPool:
        if self.retire_solved_after is None and self.retire_failed_after is None:
            raise ValueError("a TaskPool retires nothing: give retire_solved_after and/or retire_failed_after")
        return self

    def is_retired(self, task_id: str) -> bool:
        return task_id in self.retired

    def active(self, tasks: Iterable[Task]) -> Iterator[Task]:
        """The tasks not retired (lazily)."""
        return (task for task in tasks if task.id not in self.retired)

    def observe(self, group: GroupResult, difficulty: DifficultyFilter | None = None) -> Retired | None:
        """Record a finished group's outcome (read with `difficulty`'s reward range, by default 0 to 1);
        returns why its task was retired when this group retired it. A group seen before (by
        `group_id`) and groups with no scored sample change nothing."""
        outcome = (difficulty or DifficultyFilter()).outcome(group.rewards)
        if outcome == "infra_failed" or group.task_id in self.retired:
            return None
        seen = self.history.setdefault(group.task_id, [])
        if group.group_id and any(o.group_id == group.group_id for o in seen):
            return None
        seen.append(Observation(group_id=group.group_id, outcome=outcome))
        del seen[: -max(self.retire_solved_after or 0, self.retire_failed_after or 0)]
        rules: tuple[tuple[Retired, int | None], ...] = (
            ("solved", self.retire_solved_after),
            ("failed", self.retire_failed_after),
        )
        for reason, after in rules:
            if after is not None and len(seen) >= after and all(o.outcome == reason for o in seen[-after:]):
                self.retired[group.task_id] = reason
                return reason
        return None
