"""Fused turns (gymflow.activities.turn) are for stateless envs only, and what a rollout asks is honoured
only where it is sound; the classic and fused plans give the same trajectory (test_rollout.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp_support import activity_types
from pydantic import ValidationError, create_model
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from gymflow.activities import errors
from gymflow.activities.env import state_key
from gymflow.activities.model import GenerateInput
from gymflow.activities.schema import RolloutLimits
from gymflow.activities.turn import PlayTurnInput, PlayTurnResult, TurnActivities
from gymflow.envs.contract import BaseEnv, Message, Reward, Task, ToolResult, ToolSpec, Wire
from gymflow.envs.envfile import EnvFileError, env_class_from_file
from gymflow.workers.client import DATA_CONVERTER, describe_validation_error
from gymflow.workers.roles import all_workflows
from gymflow.workers.sandbox_runner import workflow_runner
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.fused_turns import CALL_LINES_PATCH
from support import ScriptedPolicy, call, play


def test_only_a_stateless_env_may_fuse_its_turns(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="stateless"):

        class Stateful(BaseEnv):  # a counter would count twice on a retried turn
            fused_turns = True

            async def list_tools(self) -> list[ToolSpec]:
                return []

            async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
                return ToolResult(text="")

            async def compute_reward(
                self, rollout_id: str, completion: list[Message], ground_truth: Any, **_: Any
            ) -> Reward:
                return Reward(total=0.0)

    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump({"mcpServers": {"c": {"command": "true"}}, "fused_turns": True}))
    with pytest.raises(EnvFileError, match=r"fused_turns.*stateless: true"):
        env_class_from_file(path)
    path.write_text(yaml.safe_dump({"mcpServers": {"c": {"command": "true"}}, "fused_turns": True, "stateless": True}))
    assert env_class_from_file(path).fused_turns


async def test_a_stateful_env_keeps_one_activity_per_tool_call_when_a_rollout_asks_for_fused_turns(
    client: Client, worker: RunningWorker
) -> None:
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("increment", {"by": 2}), call("increment", {"by": 3})]),
            Message(role="assistant", content="done"),
        ]
    )
    task = Task(id="count-to-5", prompt="count", ground_truth="5")
    result = await play(client, worker, script, env="counter", task=task, fuse_turns=True)
    assert result.reward is not None and result.reward.total == 1.0
    assert await activity_types(client, result.rollout_id) == [
        "init_rollout", "generate", "call_tool", "call_tool", "generate", "compute_reward",
    ]  # fmt: skip


async def test_fused_turns_keep_the_tool_budget_and_its_refusals(client: Client, worker: RunningWorker) -> None:
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("add", {"a": 1, "b": 1}), call("add", {"a": 2, "b": 2})]),
            Message(role="assistant", tool_calls=[call("add", {"a": 3, "b": 3})]),
            Message(role="assistant", content="<answer>2</answer>"),
        ]
    )
    task = Task(id="budget", prompt="p", ground_truth="2")
    result = await play(client, worker, script, env="math", task=task, limits=RolloutLimits(max_tool_calls=2))
    observations = [m.content for m in result.messages if m.role == "tool"]
    assert observations[:2] == ["2", "4"] and "budget exhausted" in observations[2]
    assert result.tool_calls == 2 and result.termination.value == "tool_budget"
    assert result.reward is not None  # scored classically: the rollout stopped on its budget, not an answer
    assert await activity_types(client, result.rollout_id) == [
        "init_rollout",
        "play_turn",
        "play_turn",
        "compute_reward",
    ]


class RecordingPolicy(ScriptedPolicy):
    """A scripted policy that keeps the conversation and tool names each request carried."""

    def __init__(self, turns: list[Message], before_turn: dict[int, Callable[[], None]] | None = None) -> None:
        super().__init__(turns, before_turn)
        self.seen: list[tuple[list[tuple[str, str]], list[str]]] = []

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        self.seen.append(([(m.role, m.content) for m in messages], [t.name for t in tools]))
        return super().respond(messages, tools)


def adding_turns() -> list[Message]:
    return [
        Message(role="assistant", tool_calls=[call("add", {"a": 1, "b": 1})]),
        Message(role="assistant", tool_calls=[call("add", {"a": 2, "b": 2})]),
        Message(role="assistant", tool_calls=[call("add", {"a": 3, "b": 3})]),
        Message(role="assistant", content="<answer>6</answer>"),
    ]


async def play_turn_inputs(client: Client, workflow_id: str) -> list[dict[str, Any]]:
    """The inputs of the workflow's play_turn activities, as recorded, as JSON with every field (the
    converter leaves out fields at their defaults: `Wire.compact_json`)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        PlayTurnInput.model_validate_json(e.activity_task_scheduled_event_attributes.input.payloads[0].data).model_dump(
            mode="json"
        )
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "play_turn"
    ]


async def play_turn_results(client: Client, workflow_id: str) -> list[bytes]:
    """The results of the workflow's completed play_turn activities, as recorded (raw JSON)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    kinds = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    return [
        done.result.payloads[0].data
        for e in history.events
        if e.HasField("activity_task_completed_event_attributes")
        and kinds[(done := e.activity_task_completed_event_attributes).scheduled_event_id] == "play_turn"
    ]


async def activity_failure_types(client: Client, workflow_id: str) -> list[str]:
    """The error type of each failed activity attempt of the workflow, in order."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [
        e.activity_task_failed_event_attributes.failure.application_failure_info.type
        for e in history.events
        if e.HasField("activity_task_failed_event_attributes")
    ]


def assert_the_model_saw_every_turn_whole(policy: RecordingPolicy, messages: list[Message]) -> None:
    """Each request carried the conversation up to its turn, as the trajectory has it, and the tools."""
    assistant_at = [i for i, m in enumerate(messages) if m.role == "assistant"]
    assert len(policy.seen) == len(assistant_at)
    for (seen, tools), end in zip(policy.seen, assistant_at, strict=True):
        assert seen == [(m.role, m.content) for m in messages[:end]]
        assert "add" in tools and tools == policy.seen[0][1]


async def test_a_fused_turn_sends_only_what_its_node_does_not_hold(client: Client, worker: RunningWorker) -> None:
    held: list[bool] = []
    policy = RecordingPolicy(adding_turns(), before_turn={3: lambda: held.append(len(worker.env.contexts) > 0)})
    task = Task(id="sum-cached", prompt="add", ground_truth="6")
    result = await play(client, worker, policy, env="math", task=task)
    key = state_key(result.rollout_id, 0)
    assert held == [True] and key not in worker.env.contexts  # freed with the state by the final turn
    assert result.reward is not None and result.reward.total == 1.0 and result.tool_calls == 3
    assert_the_model_saw_every_turn_whole(policy, result.messages)
    inputs = await play_turn_inputs(client, result.rollout_id)
    assert len(inputs) == 4
    first = inputs[0]
    assert first["cached"] is None and len(first["generate"]["messages"]) == 2  # system prompt, task
    assert [t["name"] for t in first["generate"]["tools"]] == policy.seen[0][1]
    assert first["generate"]["model"]["base_url"] and first["reward_task"]["id"] == task.id
    for turn, later in enumerate(inputs[1:], start=1):
        count = 2 + 2 * (turn - 1) + 1  # system, task, then a reply and its result per turn, this reply
        assert later["cached"]["messages"] == count
        assert [m["role"] for m in later["generate"]["messages"]] == ["tool"]  # only the new result
        # Neither model settings, tools nor task: the node holds them with the conversation.
        assert set(later["generate"]) == {"messages", "rollout_id", "turn", "token_prefix"}
        assert later["reward_task"] is None
    # ... and the final turn was scored there, against the task the node held.
    assert "compute_reward" not in await activity_types(client, result.rollout_id)


class _PreDeltaTurnInput(PlayTurnInput):
    """`PlayTurnInput` as node workers older than turn deltas read it: the model input always whole."""

    generate: GenerateInput  # type: ignore[assignment]


async def test_a_node_worker_older_than_turn_deltas_gets_the_rollouts_turns_whole(
    client: Client, monkeypatch: pytest.MonkeyPatch, worker: RunningWorker
) -> None:
    # A fleet mid-upgrade: the node refuses a delta turn as its data converter would (invalid input).
    refused: list[int] = []
    real_whole = TurnActivities._whole

    def old_node(self: TurnActivities, input: PlayTurnInput) -> Any:
        try:
            _PreDeltaTurnInput.model_validate_json(input.model_dump_json())
        except ValidationError as exc:
            refused.append(input.generate.turn)
            message = describe_validation_error(exc)
            raise ApplicationError(message, type=errors.INVALID_INPUT, non_retryable=True) from None
        return real_whole(self, input)

    monkeypatch.setattr(TurnActivities, "_whole", old_node)
    policy = RecordingPolicy(adding_turns())
    task = Task(id="sum-old-node", prompt="add", ground_truth="6")
    result = await play(client, worker, policy, env="math", task=task)
    assert refused == [1]  # the first delta; every later turn went whole
    assert result.reward is not None and result.reward.total == 1.0 and result.tool_calls == 3
    assert_the_model_saw_every_turn_whole(policy, result.messages)
    inputs = await play_turn_inputs(client, result.rollout_id)
    assert [i["cached"] is not None for i in inputs] == [False, True, False, False, False]
    assert all(i["generate"]["model"]["base_url"] for i in inputs[2:])
    failures = await activity_failure_types(client, result.rollout_id)
    assert failures == [errors.INVALID_INPUT]


async def test_a_node_that_refuses_a_turn_sent_whole_too_ends_the_rollout_once_and_frees_it(
    client: Client, monkeypatch: pytest.MonkeyPatch, worker: RunningWorker
) -> None:
    # No loop between delta and whole: a node refusing both ends the rollout, typed, and releases it.
    def refusing_node(self: TurnActivities, input: PlayTurnInput) -> Any:
        if input.generate.turn >= 1:
            raise ApplicationError("invalid PlayTurnInput: refused", type=errors.INVALID_INPUT, non_retryable=True)
        return real_whole(self, input)

    real_whole = TurnActivities._whole
    monkeypatch.setattr(TurnActivities, "_whole", refusing_node)
    task = Task(id="sum-refused", prompt="add", ground_truth="6")
    result = await play(client, worker, RecordingPolicy(adding_turns()), env="math", task=task)
    assert result.termination.value == "model_error" and result.infra_failed and result.reward is None
    assert "refused" in (result.error or "")
    assert [m.role for m in result.messages] == ["system", "user", "assistant", "tool"]  # turn 0 kept
    assert await activity_failure_types(client, result.rollout_id) == [errors.INVALID_INPUT] * 2
    assert not worker.env.held() and state_key(result.rollout_id, 0) not in worker.env.contexts


async def test_a_turn_whose_start_the_node_lost_is_sent_again_whole(
    client: Client, worker: RunningWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    contexts = worker.env.contexts
    real_get = contexts.get
    evicted: list[str] = []

    def evicting_get(state_key: str, token: str, count: int) -> Any:
        if not evicted:  # once: as an eviction (or a restarted worker) between two turns would
            evicted.append(state_key)
            contexts.forget(state_key)
        return real_get(state_key, token, count)

    policy = RecordingPolicy(
        adding_turns(), before_turn={0: lambda: monkeypatch.setattr(contexts, "get", evicting_get)}
    )
    task = Task(id="sum-evicted", prompt="add", ground_truth="6")
    result = await play(client, worker, policy, env="math", task=task)
    assert evicted and result.reward is not None and result.reward.total == 1.0 and result.recoveries == 0
    assert_the_model_saw_every_turn_whole(policy, result.messages)  # asked once per turn: the miss came first
    inputs = await play_turn_inputs(client, result.rollout_id)
    assert [i["cached"] is not None for i in inputs] == [False, True, False, True, True]
    assert inputs[2]["generate"]["messages"] == [m.model_dump(mode="json") for m in result.messages[:4]]
    assert inputs[2]["generate"]["model"] and inputs[2]["reward_task"]["id"] == task.id  # whole, settings too
    failures = await activity_failure_types(client, result.rollout_id)
    assert failures == [errors.CONTEXT_MISSING]


async def test_a_fused_turn_heads_its_result_with_its_calls_and_their_results(
    client: Client, worker: RunningWorker
) -> None:
    # What the Web UI shows of a turn without expanding it is its result's head: the calls, as
    # `server.tool(arg=value, ...) -> result`, refusals and tool errors included, come first.
    script = ScriptedPolicy(
        [
            Message(
                role="assistant",
                tool_calls=[call("add", {"a": 17, "b": 2}), call("nope", {"x": 1}), call("divide", {"a": 1, "b": 0})],
            ),
            Message(role="assistant", tool_calls=[call("multiply", {"a": 19, "b": 3}), call("add", {"a": 4, "b": 4})]),
            Message(role="assistant", content="<answer>57</answer>"),
        ]
    )
    task = Task(id="lines", prompt="p", ground_truth="57")
    result = await play(client, worker, script, env="math", task=task, limits=RolloutLimits(max_tool_calls=3))
    assert result.termination.value == "tool_budget" and result.tool_calls == 3
    raw = await play_turn_results(client, result.rollout_id)
    assert len(raw) == 2 and all(r.startswith(b'{"calls":["') for r in raw)
    first, second = (PlayTurnResult.model_validate_json(r).calls for r in raw)
    assert first[0] == "calculator.add(a=17, b=2) -> 19"
    assert first[1].startswith("nope(x=1) -> error: unknown tool 'nope'; available tools: add, ")  # no server
    assert first[2] == "calculator.divide(a=1, b=0) -> Error executing tool divide: division by zero"
    assert second[0] == "calculator.multiply(a=19, b=3) -> 57"
    assert second[1].startswith("calculator.add(a=4, b=4) -> error: tool call budget exhausted (3 calls)")
    assert all(len(line.split(" -> ", 1)[1]) <= 80 for line in first + second)  # a head; the result stays whole
    observations = [m.content for m in result.messages if m.role == "tool"]
    assert observations[0] == "19" and "available tools" in observations[1] and len(observations) == 5


_PreCallLinesTurnInput = create_model(  # type: ignore[call-overload]
    "PlayTurnInput",
    __base__=Wire,
    **{name: (field.annotation, field) for name, field in PlayTurnInput.model_fields.items() if name != "call_lines"},
)
"""`PlayTurnInput` as node workers older than call lines read it (they refuse unknown fields)."""


async def test_a_node_worker_older_than_call_lines_gets_the_rollouts_turns_without_them(
    client: Client, monkeypatch: pytest.MonkeyPatch, worker: RunningWorker
) -> None:
    refused: list[int] = []
    real_whole = TurnActivities._whole

    def old_node(self: TurnActivities, input: PlayTurnInput) -> Any:
        try:  # as the old node's data converter reads the payload: without the fields at their defaults
            _PreCallLinesTurnInput.model_validate_json(input.model_dump_json(exclude_defaults=True))
        except ValidationError as exc:
            refused.append(input.generate.turn)
            raise ApplicationError(
                describe_validation_error(exc), type=errors.INVALID_INPUT, non_retryable=True
            ) from None
        return real_whole(self, input)

    monkeypatch.setattr(TurnActivities, "_whole", old_node)
    policy = RecordingPolicy(adding_turns())
    task = Task(id="sum-no-lines", prompt="add", ground_truth="6")
    result = await play(client, worker, policy, env="math", task=task)
    assert refused == [0]  # the first turn; every later one went without asking
    assert result.reward is not None and result.reward.total == 1.0 and result.tool_calls == 3
    assert_the_model_saw_every_turn_whole(policy, result.messages)
    inputs = await play_turn_inputs(client, result.rollout_id)
    assert [i["call_lines"] for i in inputs] == [True, False, False, False, False]
    assert [i["cached"] is not None for i in inputs] == [False, False, True, True, True]  # deltas still
    assert not any(r.startswith(b'{"calls"') for r in await play_turn_results(client, result.rollout_id))
    assert await activity_failure_types(client, result.rollout_id) == [errors.INVALID_INPUT]
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    markers = [
        e.marker_recorded_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    assert len(markers) == 1 and CALL_LINES_PATCH.encode() in markers[0].details["patch-data"].payloads[0].data
    replayer = Replayer(workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner())
    await replayer.replay_workflow(history)
