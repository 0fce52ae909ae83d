"""The SDK for trainer-driven sessions (`RolloutSessionWorkflow`): the trainer generates, gymflow steps.

    session = await start_session(client, SessionInput(env="math", task=task))
    first = await session.reset()                      # tools, system prompt, first observation
    result = await session.step(text=model_output)     # observations, done, reward when done
    trajectory = await session.close()

A session is a workflow, so a trainer that crashes can re-attach by id (`attach_session`) and go on
where it was; the env's state outlives a worker crash (the session recovers it on another node).
`SyncSessions` runs the same calls from synchronous code (SkyRL calls `env.step` from a thread
pool) on one background event loop that owns the Temporal client.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities import names
from gymflow.activities.errors import SESSION_ENDED
from gymflow.activities.session_schema import (
    ResetResult,
    SessionInput,
    SessionResult,
    StepInput,
    StepResult,
    session_search_attributes,
)
from gymflow.envs.contract import Message
from gymflow.envs.errors import SessionError
from gymflow.workflows.session import RolloutSessionWorkflow

T = TypeVar("T")


class Session:
    """A running session, driven through its workflow handle."""

    def __init__(self, handle: WorkflowHandle[Any, SessionResult]) -> None:
        self.handle = handle

    @property
    def id(self) -> str:
        """The session's workflow id (also its rollout id)."""
        return self.handle.id

    async def reset(self) -> ResetResult:
        """Wait for the env; its tools, system prompt and first observation."""
        return await self._update(RolloutSessionWorkflow.reset)

    async def step(self, message: Message | None = None, *, text: str | None = None) -> StepResult:
        """One assistant turn: a `Message`, or the model's raw `text` (``<tool_call>`` blocks are parsed)."""
        return await self._update(RolloutSessionWorkflow.step, StepInput(message=message, text=text))

    async def close(self) -> SessionResult:
        """End the session and return its trajectory (the result, if the episode already ended it)."""
        try:
            return await self._update(RolloutSessionWorkflow.close)
        except SessionError:
            return await self.handle.result()

    async def _update(self, method: Any, *args: Any) -> Any:
        try:
            return await self.handle.execute_update(method, *args)
        except WorkflowUpdateFailedError as exc:  # refused by a validator, or failed in the handler
            cause = exc.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause or exc)
            raise SessionError(f"session {self.id}: {message}") from exc
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # the workflow has completed
                raise SessionError(f"session {self.id} has ended ({SESSION_ENDED})") from exc
            raise


def session_id_for(task_id: str) -> str:
    """A fresh workflow id for a session of `task_id`."""
    return f"session-{task_id}-{uuid.uuid4().hex[:8]}"


async def start_session(
    client: Client, input: SessionInput, *, task_queue: str = names.TASK_QUEUE, workflow_id: str | None = None
) -> Session:
    """Start a session (its env starts initialising at once); search attributes are set at start."""
    handle = await client.start_workflow(
        RolloutSessionWorkflow.run,
        input,
        id=workflow_id or session_id_for(input.task.id),
        task_queue=task_queue,
        search_attributes=TypedSearchAttributes(session_search_attributes(input)),
        memo={"task_id": input.task.id},
        static_summary=f"{input.env} session of task {input.task.id}",
    )
    return Session(handle)


def attach_session(client: Client, session_id: str) -> Session:
    """The session with workflow id `session_id` (a trainer re-attaching after a restart)."""
    return Session(client.get_workflow_handle(session_id, result_type=SessionResult))


class SyncSessions:
    """Sessions for synchronous callers: one background thread runs an event loop and the client.

    Args:
        address: Temporal frontend ``host:port`` (None: as `gymflow.connect` finds it).
        namespace: Temporal namespace (None: likewise).
        task_queue: The gymflow workers' shared queue.
    """

    def __init__(
        self, address: str | None = None, *, namespace: str | None = None, task_queue: str = names.TASK_QUEUE
    ) -> None:
        self.task_queue = task_queue
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gymflow-sessions", daemon=True)
        self._thread.start()
        from gymflow.workers.client import connect

        self.client: Client = self.run(connect(address, namespace=namespace))

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coroutine` on the background loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def start(self, input: SessionInput, *, workflow_id: str | None = None) -> Session:
        return self.run(start_session(self.client, input, task_queue=self.task_queue, workflow_id=workflow_id))

    def close(self) -> None:
        """Stop the background loop (sessions keep running in Temporal)."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
