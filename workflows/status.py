"""How every gymflow workflow writes GymflowStatus and its start search attributes.

What can be true. Temporal has no public API to change the search attributes of a closed
workflow, and a workflow that is terminated or times out runs no more code. So a status written
at start ("running") would stay on every workflow that ends that way, and be a lie. Hence:

* `GymflowStatus` is never written while a workflow runs: whether it runs is what Temporal's own
  `ExecutionStatus` says (`ExecutionStatus="Running"`).
* It is written once, by the closing path of the workflow's own code, in the same workflow task
  as the close: `completed`, `infra_failed` (a rollout flagged as an infrastructure failure),
  `cancelled` or `failed` (the workflow failed: invalid input such as an unknown env or a missing
  env file, or an error it could not turn into data).
* A workflow closed from outside (`temporal workflow terminate`, a run or execution timeout, a
  reset) has no `GymflowStatus`; its `ExecutionStatus` (`Terminated`, `TimedOut`) is its status.
  So is a workflow whose input could not even be decoded: it fails with `InvalidInput` before
  any gymflow code runs. No closed workflow carries a status it no longer has.
* `GymflowEnv` (and the other start attributes) are set at start: by the starter (the SDK, the
  CLI, parent workflows) or, for a workflow started without them (`temporal workflow start`),
  by the workflow's first task.

Usage, in any workflow's `run` (the body inside the block):

    with status.Closing(names.start_attributes(input.env, model=..., run=...)) as closing:
        ...
        closing.close(names.Status.INFRA_FAILED)   # optional: a final status other than completed
        return result

The block upserts the start attributes the starter did not set, and on the way out writes the
final status: the one `close` set, `completed` on a normal return, `cancelled` on cancellation,
`failed` on a workflow failure. Continue-as-new writes nothing (the next run closes), and neither
does an exception that fails only the workflow task (it is retried, and its commands are dropped).

Pure and deterministic (no I/O); passed through the workflow sandbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributePair, SearchAttributeUpdate
from temporalio.exceptions import CancelledError, FailureError

from gymflow.activities import names
from gymflow.activities.names import Status

FAILED_STATUS_PATCH = "gymflow-status-failed"
"""Patch id: a workflow that fails writes GymflowStatus="failed" (histories closed before did not).
Only consulted on the failure path, so it adds a marker to failed workflows alone."""


def final_status(error: BaseException | None) -> Status | None:
    """The status a workflow closes with when `run` ended with `error` (None: returned normally).

    None when nothing is to be written: continue-as-new, eviction (GeneratorExit), or an exception
    that fails the workflow task rather than the workflow.
    """
    if error is None:
        return Status.COMPLETED
    if isinstance(error, asyncio.CancelledError | CancelledError):
        return Status.CANCELLED
    if isinstance(error, FailureError):
        return Status.FAILED
    return None


class Closing:
    """The start attributes and the closing status of one workflow run (see the module doc).

    Args:
        attributes: What the workflow starts with (`start_attributes`); those the starter did
            not set are upserted on entry.
        enabled: False leaves every search attribute alone (histories recorded before a
            workflow type used this helper replay unchanged; gate it with `workflow.patched`).
    """

    def __init__(self, attributes: Sequence[SearchAttributePair[Any]] = (), *, enabled: bool = True) -> None:
        self._attributes = list(attributes)
        self.enabled = enabled
        self.status: Status | None = None
        """The status written at close, once it is written."""

    def __enter__(self) -> Closing:
        self.start()
        return self

    def start(self, *, only_missing: bool = True) -> None:
        """Upsert the start attributes the starter did not set (all of them if not `only_missing`)."""
        if not self.enabled:
            return
        present = workflow.info().typed_search_attributes
        missing = [
            p.key.value_set(p.value) for p in self._attributes if not only_missing or present.get(p.key) != p.value
        ]
        if missing:
            workflow.upsert_search_attributes(missing)

    def close(self, status: Status, *, reward: float | None = None) -> None:
        """Write the final status now (once; later calls and the block's exit write nothing)."""
        if not self.enabled or self.status is not None:
            return
        self.status = status
        updates: list[SearchAttributeUpdate[Any]] = [names.SA_STATUS.value_set(status.value)]
        if reward is not None:
            updates.append(names.SA_REWARD.value_set(reward))
        workflow.upsert_search_attributes(updates)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(exc)

    def end(self, exc: BaseException | None) -> None:
        """Write the final status for `run` ending with `exc` (None: a normal return), unless
        `close` wrote one already or there is none to write (see `final_status`)."""
        status = final_status(exc)
        if status is None or self.status is not None or not self.enabled:
            return
        if status is Status.FAILED and not workflow.patched(FAILED_STATUS_PATCH):
            return
        self.close(status)
