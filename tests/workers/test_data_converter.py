"""gymflow's data converter: compact turn payloads that decode to the same values, whole results."""

from __future__ import annotations

import json

from gymflow.activities.env_schema import CallToolInput, RolloutHandle
from gymflow.activities.model import GenerateResult, ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.activities.turn import PlayTurnResult
from gymflow.envs.contract import (
    Message,
    Task,
    TerminationReason,
    ToolCall,
    ToolResult,
    ToolSpec,
    Trajectory,
    Usage,
    Wire,
)
from gymflow.workers.client import DATA_CONVERTER

CONVERTER = DATA_CONVERTER.payload_converter


def _round_trip(value: Wire) -> tuple[dict[str, object], Wire]:
    payload = CONVERTER.to_payloads([value])[0]
    return json.loads(payload.data), CONVERTER.from_payloads([payload], [type(value)])[0]


def _reply() -> GenerateResult:
    call = ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2}, raw_arguments='{"a": 1, "b": 2}')
    message = Message(role="assistant", content="", tool_calls=[call])
    return GenerateResult(message=message, finish_reason="tool_calls", usage=Usage(prompt_tokens=9), model="m")


def test_turn_payloads_leave_out_their_defaults_and_decode_to_the_same_values() -> None:
    turn = PlayTurnResult(results=[ToolResult(text="3")], generated=_reply(), context_token="t")
    written, read = _round_trip(turn)
    assert read == turn
    assert written["results"] == [{"text": "3"}]  # is_error, structured, truncated_chars, attachments: defaults
    message = written["generated"]["message"]  # type: ignore[index]
    assert "tool_call_id" not in message and "is_error" not in message and "parse_error" not in message["tool_calls"][0]
    assert "reward" not in written and "tokens" not in written["generated"]  # type: ignore[operator]

    rollout = RolloutInput(env="math", task=Task(id="t", prompt="2+2?"), model=ModelConfig(base_url="http://x/v1"))
    written, read = _round_trip(rollout)
    assert read == rollout and written["model"] == {"base_url": "http://x/v1"} and "limits" not in written


def test_a_value_set_to_its_default_still_decodes_to_it() -> None:
    call = CallToolInput(env="math", state_key="k", call=ToolCall(id="c", name="add", arguments={}), timeout_s=60.0)
    assert _round_trip(call)[1] == call
    handle = RolloutHandle(state_key="k", node_id="n", node_queue="q", tools=[ToolSpec(name="add")], system_prompt="")
    assert _round_trip(handle)[1] == handle


def test_results_people_read_as_json_stay_whole() -> None:
    trajectory = Trajectory(
        rollout_id="r",
        task_id="t",
        env="math",
        messages=[Message(role="user", content="q")],
        termination=TerminationReason.FINAL_ANSWER,
    )
    written, read = _round_trip(trajectory)
    assert read == trajectory
    assert written["recoveries"] == 0 and written["messages"][0]["is_error"] is False  # type: ignore[index]
