"""RolloutWorkflow on a real dev server, real calculator MCP processes and a real HTTP policy."""

from __future__ import annotations

import json
import uuid

import pytest
from mcp_support import activity_types
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import SA_STATUS
from gymflow.activities.schema import RetrySettings, RolloutInput, RolloutLimits
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Message, TerminationReason, Trajectory
from gymflow.workers.client import DATA_CONVERTER
from gymflow.workers.roles import all_workflows
from gymflow.workers.sandbox_runner import workflow_runner
from gymflow.workers.sdk.client import run_rollout, start_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call


def rollout_input(model_url: str, *, seed: int = 0, **fields: object) -> RolloutInput:
    task = generate_tasks(1, seed=seed)[0]
    return RolloutInput(env="math", task=task, model=ModelConfig(base_url=model_url), **fields)  # type: ignore[arg-type]


async def local_activity_types(client: Client, workflow_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    markers = [
        e.marker_recorded_event_attributes
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    return [json.loads(m.details["data"].payloads[0].data)["activity_type"] for m in markers]


async def test_math_rollout_solves_task_with_tools(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    # The classic plan: one activity per model turn and per tool call (math asks for fused turns).
    classic = rollout_input(calculator_policy_url, fuse_turns=False)
    result = await run_rollout(client, classic, task_queue=worker.task_queue)
    assert result.termination == TerminationReason.FINAL_ANSWER
    assert not result.infra_failed
    assert result.reward is not None and result.reward.total == 1.0
    assert result.tool_calls >= 1
    kinds = await activity_types(client, result.rollout_id)
    # A successful compute_reward frees the rollout's state: no release_rollout follows it.
    assert kinds[0] == "init_rollout" and kinds[-1] == "compute_reward"
    assert kinds.count("call_tool") == result.tool_calls
    assert kinds.count("generate") == result.turns and "release_rollout" not in kinds
    assert await local_activity_types(client, result.rollout_id) == []
    assert worker.env.env("math").live_rollouts() == []  # type: ignore[attr-defined]


async def test_fused_turns_are_one_activity_per_turn_with_the_same_trajectory(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    fused = await run_rollout(client, rollout_input(calculator_policy_url), task_queue=worker.task_queue)
    classic = await run_rollout(
        client, rollout_input(calculator_policy_url, fuse_turns=False), task_queue=worker.task_queue
    )
    assert fused.reward is not None and fused.reward.total == 1.0 and fused.tool_calls >= 1
    # init, then one activity per turn; the last one scored the answer and freed the state.
    assert await activity_types(client, fused.rollout_id) == ["init_rollout"] + ["play_turn"] * fused.turns
    assert worker.env.env("math").live_rollouts() == []  # type: ignore[attr-defined]
    assert fused.messages == classic.messages and fused.reward == classic.reward
    assert (fused.turns, fused.tool_calls, fused.termination) == (
        classic.turns,
        classic.tool_calls,
        classic.termination,
    )


async def test_model_turns_as_local_activities(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    model = ModelConfig(base_url=calculator_policy_url, local_activity=True)
    result = await run_rollout(client, rollout_input(calculator_policy_url).model_copy(update={"model": model}),
                               task_queue=worker.task_queue)  # fmt: skip
    assert result.reward is not None and result.reward.total == 1.0
    kinds = await activity_types(client, result.rollout_id)
    assert "generate" not in kinds and kinds.count("call_tool") == result.tool_calls
    assert await local_activity_types(client, result.rollout_id) == ["generate"] * result.turns


async def test_failed_reward_still_releases(client: Client, worker: RunningWorker, calculator_policy_url: str) -> None:
    env = worker.env.env("math")

    async def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("no reward today")

    env.compute_reward = broken  # type: ignore[method-assign]
    result = await run_rollout(client, rollout_input(calculator_policy_url), task_queue=worker.task_queue)
    assert result.termination == TerminationReason.REWARD_ERROR and result.infra_failed
    kinds = await activity_types(client, result.rollout_id)
    assert kinds[-2:] == ["compute_reward", "release_rollout"]
    assert env.live_rollouts() == []  # type: ignore[attr-defined]


async def test_hermes_tool_format(client: Client, worker: RunningWorker, calculator_policy_url: str) -> None:
    task = generate_tasks(1, seed=7)[0]
    model = ModelConfig(base_url=calculator_policy_url, tool_format="hermes")
    result = await run_rollout(client, RolloutInput(env="math", task=task, model=model), task_queue=worker.task_queue)
    assert result.reward is not None and result.reward.total == 1.0
    assert result.tool_calls >= 1


@pytest.mark.parametrize("fused", [False, True], ids=["classic", "fused-turns"])
async def test_bad_model_output_becomes_error_observations(client: Client, worker: RunningWorker, fused: bool) -> None:
    policy = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("add", raw='{"a": 1, "b": ')]),  # broken JSON
            Message(role="assistant", tool_calls=[call("launch_missiles", {"target": "moon"})]),  # unknown tool
            Message(role="assistant", tool_calls=[call("add", {"a": "one", "b": [2]})]),  # wrong types
            Message(role="assistant", tool_calls=[call("divide", {"a": 1, "b": 0})]),  # tool raises
            Message(role="assistant", tool_calls=[call("add", {"a": 2, "b": 3})]),  # fine
            Message(role="assistant", content="<answer>5</answer>"),
        ]
    )
    async with PolicyServer(policy, host="127.0.0.1", port=0) as server:
        result = await run_rollout(client, rollout_input(server.url, fuse_turns=fused), task_queue=worker.task_queue)
    assert result.termination == TerminationReason.FINAL_ANSWER
    assert not result.infra_failed
    observations = [m for m in result.messages if m.role == "tool"]
    assert [m.is_error for m in observations] == [True, True, True, True, False]
    assert "parse" in observations[0].content
    assert "unknown tool 'launch_missiles'" in observations[1].content
    assert "add" in observations[2].content and "valid number" in observations[2].content
    assert "zero" in observations[3].content.lower()
    assert observations[4].content.strip() == "5"
    # Malformed and unknown calls never reach the env; the others are real activities.
    assert result.tool_calls == 3
    kinds = await activity_types(client, result.rollout_id)
    assert (kinds.count("call_tool"), kinds.count("play_turn")) == ((0, 6) if fused else (3, 0))


@pytest.mark.parametrize("local", [False, True], ids=["activity", "local-activity"])
async def test_model_endpoint_down_is_typed_infra_failure(client: Client, worker: RunningWorker, local: bool) -> None:
    dead = "http://127.0.0.1:9/v1"  # discard port: nothing listens
    model = ModelConfig(base_url=dead, local_activity=local)
    handle = await start_rollout(
        client,
        RolloutInput(env="math", task=generate_tasks(1)[0], model=model, retry=RetrySettings(model_attempts=2)),
        task_queue=worker.task_queue,
    )
    result = await handle.result()
    assert result.termination == TerminationReason.MODEL_ERROR
    assert result.infra_failed and result.reward is None
    assert result.error and "model request" in result.error and result.error.startswith(("generate", "play_turn"))
    described = await handle.describe()
    assert described.typed_search_attributes.get(SA_STATUS) == "infra_failed"
    assert worker.env.env("math").live_rollouts() == []  # type: ignore[attr-defined]


async def test_limits_end_rollout_with_typed_reason(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    task = generate_tasks(1, seed=3, difficulty=4)[0]
    model = ModelConfig(base_url=calculator_policy_url)
    one_turn = RolloutInput(env="math", task=task, model=model, limits=RolloutLimits(max_turns=1))
    result = await run_rollout(client, one_turn, task_queue=worker.task_queue)
    assert result.termination == TerminationReason.MAX_TURNS and result.turns == 1
    assert result.reward is not None and result.reward.total == 0.0  # a real 0: no answer given

    one_call = RolloutInput(env="math", task=task, model=model, limits=RolloutLimits(max_tool_calls=1))
    result = await run_rollout(client, one_call, task_queue=worker.task_queue)
    assert result.termination == TerminationReason.TOOL_BUDGET and result.tool_calls == 1


async def test_unknown_env_fails_workflow_without_retrying(client: Client, worker: RunningWorker) -> None:
    bad = RolloutInput(env="no-such-env", task=generate_tasks(1)[0])
    handle = await start_rollout(client, bad, task_queue=worker.task_queue)
    with pytest.raises(WorkflowFailureError) as info:
        await handle.result()
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput"
    assert "no-such-env" in str(cause)


async def test_history_is_json_replayable(client: Client, worker: RunningWorker, calculator_policy_url: str) -> None:
    """Histories round-trip through JSON (what `temporal workflow show --output json` gives)."""
    result = await run_rollout(client, rollout_input(calculator_policy_url, seed=11), task_queue=worker.task_queue)
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    assert json.loads(history.to_json())["events"]


def _patch_markers_and_change_versions(history: WorkflowHistory) -> tuple[int, int]:
    markers = sum(
        1
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    )
    versions = sum(
        1
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
        and "TemporalChangeVersion"
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    )
    return markers, versions


async def test_a_starter_declaring_the_plan_spares_the_patch_marker_and_replays(
    client: Client, worker: RunningWorker, calculator_policy_url: str
) -> None:
    declared = await run_rollout(client, rollout_input(calculator_policy_url, seed=5), task_queue=worker.task_queue)
    assert declared.reward is not None and declared.reward.total == 1.0
    history = await client.get_workflow_handle(declared.rollout_id).fetch_history()
    assert _patch_markers_and_change_versions(history) == (0, 0)
    # A full replay (what a worker that did not run it does) decides the plan as the first run did.
    replayer = Replayer(workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner())
    await replayer.replay_workflow(history)

    # Started without the memo (a plain `temporal workflow start`): the patch decides, as before.
    plain_id = f"plain-{uuid.uuid4().hex[:8]}"
    plain = rollout_input(calculator_policy_url, seed=5)
    await client.execute_workflow("RolloutWorkflow", plain, id=plain_id, task_queue=worker.task_queue)
    plain_history = await client.get_workflow_handle(plain_id).fetch_history()
    markers, versions = _patch_markers_and_change_versions(plain_history)
    assert markers >= 1 and versions >= 1  # this plan's patch (and GymflowTask's: no attributes were set)
    await replayer.replay_workflow(plain_history)


@pytest.mark.parametrize("plan", ["two", 1, None, True])
async def test_a_stray_plan_memo_leaves_the_plan_to_the_patch(
    client: Client, worker: RunningWorker, calculator_policy_url: str, plan: object
) -> None:
    """A memo `plan` the workflow does not recognise (a typo, an older value, a hand-written start)
    neither fails the rollout nor skips the patch: the patch decides, as without the memo."""
    workflow_id = f"stray-plan-{uuid.uuid4().hex[:8]}"
    result = await client.execute_workflow(
        "RolloutWorkflow",
        rollout_input(calculator_policy_url, seed=6),
        id=workflow_id,
        task_queue=worker.task_queue,
        memo={"plan": plan},
        result_type=Trajectory,
    )
    assert result.reward is not None and result.reward.total == 1.0
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    assert _patch_markers_and_change_versions(history)[0] >= 1
