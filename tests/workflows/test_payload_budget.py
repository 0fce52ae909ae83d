"""Conversations larger than Temporal's payload limit: a rollout stops with a cut, visible last
message instead of failing workflow tasks forever, and a group passes large conversations by
reference. Real dev server, real HTTP policy, no external payload storage."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import PAYLOAD_LIMIT_BYTES, GroupInput, RolloutInput, RolloutLimits
from gymflow.envs.contract import Message, Task, TerminationReason, json_bytes
from gymflow.envs.registry import register
from gymflow.envs.wire.tokens import TurnTokens
from gymflow.workers.sdk.client import with_messages
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.budget import SLACK_BYTES, TrajectoryBudget
from gymflow.workflows.group import GroupRolloutWorkflow
from support import InProcessMathEnv, ScriptedPolicy, call

TASK = Task(id="t", prompt="2+3?", ground_truth="5")


def test_budget_admits_what_fits_and_cuts_the_message_that_crosses_it() -> None:
    budget = TrajectoryBudget(200_000, TASK)
    assert budget.limit == 200_000 - json_bytes(TASK) - SLACK_BYTES
    assert budget.fits([Message(role="user", content="2+3?")])
    small = Message(role="assistant", content="x" * 1000, tool_calls=[call("add", {"a": 2, "b": 3})])
    assert budget.admit(small) == (small, True)
    huge = Message(role="assistant", content="é\x01" * 100_000, tool_calls=[call("add", {"a": 2, "b": 3})])
    cut, whole = budget.admit(huge)
    assert not whole and cut.tool_calls == [] and cut.content.startswith("é\x01")
    assert "payload budget" in cut.content and "1 tool call(s) were not run" in cut.content
    assert budget.limit is not None and budget.used <= budget.limit  # the cut copy fits exactly
    assert json_bytes(cut) > (budget.limit - json_bytes(small) - 200) // 2  # and keeps what it can


def test_token_data_is_charged_and_refused_whole_when_it_does_not_fit() -> None:
    budget = TrajectoryBudget(SLACK_BYTES + json_bytes(TASK) + 50_000, TASK)
    turn = TurnTokens(turn=0, prompt_ids=list(range(3000)), prompt_length=3000, completion_ids=[1] * 1000)
    assert json_bytes(turn) < 4000 * 5.4  # base64 int32: ~5.3 bytes a token
    assert budget.charge(turn) and budget.charge(turn)
    used = budget.used
    assert not budget.charge(turn) and budget.used == used  # the third does not fit: nothing counted


def test_an_unbounded_budget_admits_anything() -> None:
    budget = TrajectoryBudget(None, TASK)
    huge = Message(role="assistant", content="a" * 3_000_000)
    assert budget.admit(huge) == (huge, True) and budget.fits([huge])


def largest_payload(events: Sequence[Any]) -> int:
    return max((len(p.data) for e in events for p in payloads_of(e)), default=0)


def payloads_of(event: Any) -> list[Any]:
    for field in ("activity_task_scheduled_event_attributes", "workflow_execution_completed_event_attributes"):
        if event.HasField(field):
            attributes = getattr(event, field)
            return list((attributes.input if hasattr(attributes, "input") else attributes.result).payloads)
    return []


async def test_a_conversation_at_the_payload_limit_stops_the_rollout_instead_of_hanging_it(
    client: Client, worker: RunningWorker
) -> None:
    # Each reply is ~0.9 MB (1.8 MB of UTF-8): the second could not travel to the next turn.
    talkative = Message(role="assistant", content="é" * 900_000, tool_calls=[call("add", {"a": 2, "b": 3})])
    async with PolicyServer(ScriptedPolicy([talkative])) as server:
        handle = await client.start_workflow(
            "RolloutWorkflow",
            RolloutInput(
                env="math-inproc", task=TASK, model=ModelConfig(base_url=server.url), limits=RolloutLimits(max_turns=4)
            ),
            id=f"big-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
            result_type=dict,
        )
        result = await handle.result()
    events = (await handle.fetch_history()).events
    assert not any(e.HasField("workflow_task_failed_event_attributes") for e in events)
    assert result["termination"] == TerminationReason.CONTEXT_BUDGET and result["reward"] is not None
    last = result["messages"][-1]
    assert last["role"] == "assistant" and last["tool_calls"] == [] and "payload budget" in last["content"]
    assert sum(m["role"] == "assistant" for m in result["messages"]) == 2  # the first whole, the second cut
    assert largest_payload(events) < PAYLOAD_LIMIT_BYTES


async def test_a_reply_over_the_payload_limit_is_a_clear_model_error_not_retried(
    client: Client, worker: RunningWorker
) -> None:
    async with PolicyServer(ScriptedPolicy([Message(role="assistant", content="a" * 2_500_000)])) as server:
        handle = await client.start_workflow(
            "RolloutWorkflow",
            RolloutInput(env="math-inproc", task=TASK, model=ModelConfig(base_url=server.url)),
            id=f"huge-reply-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
            result_type=dict,
        )
        result = await handle.result()
    assert result["termination"] == TerminationReason.MODEL_ERROR and result["infra_failed"]
    assert "over the 2097152-byte payload limit" in result["error"] and "TMPRL" not in result["error"]
    events = (await handle.fetch_history()).events
    started = [e for e in events if e.HasField("activity_task_started_event_attributes")]
    assert [e.activity_task_started_event_attributes.attempt for e in started][:2] == [1, 1]  # init, one generate


async def test_a_task_too_large_for_any_conversation_is_invalid_input(client: Client, worker: RunningWorker) -> None:
    task = Task(id="huge", prompt="x" * 1_100_000, ground_truth="5")
    async with PolicyServer(ScriptedPolicy([Message(role="assistant", content="5")])) as server:
        handle = await client.start_workflow(
            "RolloutWorkflow",
            RolloutInput(env="math-inproc", task=task, model=ModelConfig(base_url=server.url)),
            id=f"huge-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput"
    assert "'huge'" in cause.message and "GYMFLOW_PAYLOAD_STORAGE_URI" in cause.message
    events = (await handle.fetch_history()).events
    kinds = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events
             if e.HasField("activity_task_scheduled_event_attributes")]  # fmt: skip
    assert kinds == ["init_rollout", "release_rollout"]  # nothing sent to the model; the env freed


class LongestAnswerEnv(InProcessMathEnv):
    """Adds a group reward that reads every conversation: 1 for the group's longest final answer."""

    name = "math-longest"

    async def compute_group_reward(
        self, rollout_ids: Sequence[str], completions: Sequence[list[Message]], ground_truths: Sequence[Any],
        **kwargs: Any,
    ) -> list[dict[str, float]]:  # fmt: skip
        lengths = [len(c[-1].content) for c in completions]
        return [{"longest": float(n == max(lengths))} for n in lengths]


register(LongestAnswerEnv.name, LongestAnswerEnv)


class GrowingAnswers(ScriptedPolicy):
    """Answers 5, padded: each sample's answer is longer than the one before (0.65-0.95 MB; 2.4 MB together)."""

    def __init__(self) -> None:
        super().__init__([])
        self.count = 0

    def respond(self, messages: Sequence[Message], tools: Sequence[Any]) -> Message:
        self.count += 1
        return Message(role="assistant", content="<answer>5</answer>" + " " * (500_000 + 150_000 * self.count))


async def test_a_large_group_passes_its_conversations_by_reference(client: Client, worker: RunningWorker) -> None:
    async with PolicyServer(GrowingAnswers()) as server:
        template = RolloutInput(env="math-longest", task=TASK, model=ModelConfig(base_url=server.url))
        handle: WorkflowHandle[Any, Any] = await client.start_workflow(
            GroupRolloutWorkflow.run, GroupInput(rollout=template, n=3),
            id=f"group-big-{uuid.uuid4().hex[:8]}", task_queue=worker.task_queue,
        )  # fmt: skip
        group = await handle.result()
    events = (await handle.fetch_history()).events
    assert not any(e.HasField("workflow_task_failed_event_attributes") for e in events)
    assert group.messages_omitted and all(t.messages == [] for t in group.trajectories)
    # The group reward read the conversations from the rollouts: exactly the longest answer won.
    assert sorted(t.reward.components["group/longest"] for t in group.trajectories if t.reward) == [0.0, 0.0, 1.0]
    full = await with_messages(client, group)
    assert not full.messages_omitted
    lengths = [len(t.messages[-1].content) for t in full.trajectories]
    longest = lengths.index(max(lengths))
    assert full.trajectories[longest].reward.components["group/longest"] == 1.0  # type: ignore[union-attr]
    assert [t.reward for t in full.trajectories] == [t.reward for t in group.trajectories]
