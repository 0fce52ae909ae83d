"""RolloutSessionWorkflow: a trainer drives reset / step / close through Updates, on a real server."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from gymflow.activities.names import SA_ENV, SA_REWARD, SA_STATUS, SA_TASK, SESSION_WORKFLOW
from gymflow.activities.schema import RetrySettings
from gymflow.activities.session_schema import SessionInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Message, Task, TerminationReason
from gymflow.envs.errors import SessionError
from gymflow.envs.mcp.env import McpEnv
from gymflow.workers.sdk.sessions import attach_session, start_session
from gymflow.workers.worker import RunningWorker
from support import CounterEnv, call


def kill_servers(worker: RunningWorker, env_name: str) -> None:
    """kill -9 every MCP server process `env_name` holds on `worker`."""
    env = worker.env.env(env_name)
    assert isinstance(env, McpEnv)
    for rollout_id in env.live_rollouts():
        for pid in env.server_pids(rollout_id).values():
            assert pid is not None
            os.kill(pid, signal.SIGKILL)


def tool_text(name: str, arguments: dict[str, object]) -> str:
    """What a hermes-format model writes to call a tool."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def test_a_math_episode_step_by_step(client: Client, worker: RunningWorker) -> None:
    task = Task(id="add-2-3", prompt="What is 2 + 3?", ground_truth="5")
    session = await start_session(client, SessionInput(env="math", task=task), task_queue=worker.task_queue)
    first = await session.reset()
    assert {t.name for t in first.tools} >= {"add", "multiply"}
    assert first.messages[-1] == Message(role="user", content="What is 2 + 3?")
    step = await session.step(text="Let me add.\n" + tool_text("add", {"a": 2, "b": 3}))
    assert not step.done and step.observations[0].content == "5" and step.turn == 1
    last = await session.step(text="<answer>5</answer>")
    assert last.done and last.termination == TerminationReason.FINAL_ANSWER
    assert last.reward is not None and last.reward.total == 1.0
    trajectory = await session.close()
    assert trajectory.reward == last.reward and trajectory.turns == 2 and trajectory.tool_calls == 1
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    attributes = (await session.handle.describe()).typed_search_attributes
    assert attributes.get(SA_STATUS) == "completed" and attributes.get(SA_REWARD) == 1.0
    assert attributes.get(SA_ENV) == "math" and attributes.get(SA_TASK) == "add-2-3"
    with pytest.raises(SessionError):
        await session.step(text="<answer>5</answer>")  # the episode is over


async def test_a_wrong_answer_scores_zero(client: Client, worker: RunningWorker) -> None:
    task = generate_tasks(1, seed=4)[0]
    session = await start_session(client, SessionInput(env="math", task=task), task_queue=worker.task_queue)
    await session.reset()
    last = await session.step(Message(role="assistant", content="<answer>-123456789</answer>"))
    assert last.done and last.reward is not None and last.reward.total == 0.0 and not last.infra_failed


def increment(by: int) -> Message:
    return Message(role="assistant", tool_calls=[call("increment", {"by": by})])


async def test_tool_state_lives_across_steps_and_sessions_are_isolated(client: Client, worker: RunningWorker) -> None:
    sessions = []
    for i in range(2):
        task = Task(id=f"c{i}", prompt="count", ground_truth="7")
        sessions.append(
            await start_session(client, SessionInput(env="counter", task=task), task_queue=worker.task_queue)
        )
    for session in sessions:
        await session.reset()
    assert (await sessions[0].step(increment(3))).observations[0].content == "3"
    assert (await sessions[1].step(increment(1))).observations[0].content == "1"
    # A trainer that restarted re-attaches by id.
    again = attach_session(client, sessions[0].id)
    assert (await again.step(increment(4))).observations[0].content == "7"
    done = await again.step(Message(role="assistant", content="7"))
    assert done.reward is not None and done.reward.total == 1.0  # the reward read the live counter
    other = await sessions[1].close()  # closed before done: unscored, never a reward of 0
    assert other.termination == TerminationReason.CANCELLED and other.reward is None and other.infra_failed


async def test_a_lost_server_is_recovered_between_steps_for_replayable_envs(
    client: Client, worker: RunningWorker
) -> None:
    task = Task(id="r", prompt="count", ground_truth="5")
    session = await start_session(
        client, SessionInput(env="counter-replayable", task=task), task_queue=worker.task_queue
    )
    await session.reset()
    await session.step(increment(2))
    kill_servers(worker, "counter-replayable")
    step = await session.step(increment(3))
    assert step.observations[0].content == "5" and not step.done  # the increment by 2 was replayed first
    done = await session.step(Message(role="assistant", content="5"))
    assert done.reward is not None and done.reward.total == 1.0
    assert (await session.close()).recoveries == 1


async def test_step_limits_and_refusals(client: Client, worker: RunningWorker) -> None:
    from gymflow.activities.schema import RolloutLimits

    task = Task(id="m", prompt="count", ground_truth="1")
    session = await start_session(
        client, SessionInput(env="counter", task=task, limits=RolloutLimits(max_turns=2)), task_queue=worker.task_queue
    )
    with pytest.raises(SessionError, match="call reset before the first step"):
        await session.step(text="hi")
    await session.reset()
    assert not (await session.step(text=tool_text("increment", {"by": 1}))).done
    with pytest.raises(SessionError, match="start a new session"):
        await session.reset()
    last = await session.step(text=tool_text("nope", {}))
    assert "unknown tool 'nope'" in last.observations[0].content
    assert last.done and last.termination == TerminationReason.MAX_TURNS and last.reward is not None


async def test_an_idle_session_frees_its_env_and_ends(client: Client, worker: RunningWorker) -> None:
    task = Task(id="idle", prompt="count", ground_truth="0")
    session = await start_session(
        client, SessionInput(env="counter", task=task, idle_timeout_s=1), task_queue=worker.task_queue
    )
    await session.reset()
    trajectory = await session.handle.result()
    assert trajectory.termination == TerminationReason.IDLE_TIMEOUT and trajectory.infra_failed
    env = worker.env.env("counter")
    assert isinstance(env, CounterEnv) and not env.live_rollouts()  # released
    assert (await session.close()).termination == TerminationReason.IDLE_TIMEOUT


async def test_an_unknown_env_fails_the_session_as_invalid_input(client: Client, worker: RunningWorker) -> None:
    task = Task(id="x", prompt="hi")
    session = await start_session(
        client,
        SessionInput(env="no-such-env", task=task, retry=RetrySettings(env_attempts=1)),
        task_queue=worker.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await session.handle.result()
    assert isinstance(failure.value.cause, ApplicationError) and failure.value.cause.type == "InvalidInput"


async def test_invalid_input_fails_at_once_naming_the_field(client: Client, worker: RunningWorker) -> None:
    handle = await client.start_workflow(
        SESSION_WORKFLOW,
        {"env": "math", "idle_timeout_s": 5},
        id=f"bad-{uuid.uuid4().hex[:8]}",
        task_queue=worker.task_queue,
    )  # as `temporal workflow start --input` would send it
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and "task" in cause.message


async def test_an_invalid_step_is_refused_and_loses_nothing(client: Client, worker: RunningWorker) -> None:
    task = Task(id="v", prompt="count", ground_truth="2")
    session = await start_session(client, SessionInput(env="counter", task=task), task_queue=worker.task_queue)
    await session.reset()
    with pytest.raises(WorkflowUpdateFailedError) as failure:  # raw JSON, as another language's client might send
        await session.handle.execute_update("step", {"text": "hi", "message": {"role": "user", "content": "x"}})
    assert "exactly one of `message` or `text`" in str(failure.value.cause)
    assert (await session.step(increment(2))).observations[0].content == "2"  # the session goes on
    assert (await session.step(Message(role="assistant", content="2"))).reward.total == 1.0  # type: ignore[union-attr]
