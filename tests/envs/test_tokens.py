"""gymflow.envs.wire.tokens: compact encoding, the concatenated sequence and its loss mask, endpoint shapes."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gymflow.envs.contract import Message, TerminationReason, Trajectory
from gymflow.envs.errors import TokenDataError, TokenMismatch
from gymflow.envs.wire.tokens import (
    TurnTokens,
    build_segments,
    build_sequence,
    completion_token_data,
    pack_ints,
    turn_tokens,
    unpack_floats,
)


def test_ids_travel_as_base64_int32_and_come_back_as_lists() -> None:
    turn = TurnTokens(turn=0, prompt_ids=[1, 2, 70000], prompt_length=3, completion_ids=[5], logprobs=[-0.25])
    wire = json.loads(turn.model_dump_json())
    assert wire["prompt_ids"] == pack_ints([1, 2, 70000])
    assert unpack_floats(wire["logprobs"]) == [-0.25]
    again = TurnTokens.model_validate_json(turn.model_dump_json())
    assert again.prompt_ids == [1, 2, 70000] and again.logprobs == [-0.25]
    assert turn.model_dump()["prompt_ids"] == [1, 2, 70000]  # python mode: plain lists


@pytest.mark.parametrize("bad", ["not base64!", "AAA=", [1.5], [True], [2**31]])
def test_malformed_token_arrays_are_rejected(bad: object) -> None:
    with pytest.raises(ValidationError):
        TurnTokens(turn=0, prompt_ids=bad, prompt_length=0, completion_ids=[])  # type: ignore[arg-type]


def three_turns() -> list[TurnTokens]:
    """Prompts [1,2] -> [3]; [1,2,3,4,5] -> [6,7]; [1..7,8] -> [9], recorded as the activity does."""
    turns, prefix = [], None
    for i, (prompt, completion) in enumerate(
        [([1, 2], [3]), ([1, 2, 3, 4, 5], [6, 7]), ([1, 2, 3, 4, 5, 6, 7, 8], [9])]
    ):
        record, prefix = turn_tokens(
            turn=i, prompt_ids=prompt, completion_ids=completion, logprobs=[-1.0] * len(completion), prefix=prefix
        )
        turns.append(record)
    return turns


def test_sequence_concatenates_turns_and_masks_only_completions() -> None:
    turns = three_turns()
    assert [t.prompt_ids for t in turns] == [[1, 2], [4, 5], [8]]  # only the new prompt tokens are stored
    assert [t.extends for t in turns] == [None, True, True]
    seq = build_sequence(turns, expected_turns=3)
    assert seq.ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert seq.loss_mask == [0, 0, 1, 0, 0, 1, 1, 0, 1]
    assert seq.logprobs == [0.0, 0.0, -1.0, 0.0, 0.0, -1.0, -1.0, 0.0, -1.0]


def test_a_prompt_that_does_not_extend_the_previous_one_is_reported() -> None:
    first, prefix = turn_tokens(turn=0, prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=None, prefix=None)
    # The template re-rendered the completion [3, 4] as [3, 9] in history.
    second, _ = turn_tokens(turn=1, prompt_ids=[1, 2, 3, 9, 5], completion_ids=[6], logprobs=None, prefix=prefix)
    assert second.extends is False and second.prompt_ids == [1, 2, 3, 9, 5]
    with pytest.raises(
        TokenMismatch, match=r"turn 1's prompt does not extend turn 0's.*token 3 \(expected 4, found 9\)"
    ):
        build_sequence([first, second])


def test_missing_turns_are_reported() -> None:
    turns = three_turns()
    with pytest.raises(TokenDataError, match=r"turn\(s\) \[1\] have none"):
        build_sequence([turns[0], turns[2]], expected_turns=3)
    trajectory = Trajectory(
        rollout_id="r", task_id="t", env="math", messages=[Message(role="user", content="hi")],
        termination=TerminationReason.FINAL_ANSWER, turns=3, tokens=turns[:2],
    )  # fmt: skip
    with pytest.raises(TokenDataError, match=r"\[2\] have none"):
        trajectory.token_sequence()


def test_vllm_and_sglang_answer_shapes_are_read() -> None:
    logprobs = {"content": [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:8", "logprob": -1.5}]}
    vllm = {"prompt_token_ids": [1, 2], "choices": [{"message": {}, "token_ids": [7, 8], "logprobs": logprobs}]}
    assert completion_token_data(vllm) == ([1, 2], [7, 8], [-0.5, -1.5])
    old_vllm = {"choices": [{"message": {}, "logprobs": logprobs}]}  # ids only in the logprob tokens
    assert completion_token_data(old_vllm) == (None, [7, 8], [-0.5, -1.5])
    sglang = {
        "choices": [
            {
                "message": {},
                "prompt_token_ids": [1],
                "token_ids": [7],
                "logprobs": {"content": [{"token": "x", "logprob": -2.0}]},
            }
        ]
    }
    assert completion_token_data(sglang) == ([1], [7], [-2.0])
    assert completion_token_data({"choices": [{"message": {}, "token_ids": ["x"]}]}) == (None, None, None)
    mismatched = {
        "choices": [{"message": {}, "token_ids": [1, 2], "logprobs": {"content": [{"token": "a", "logprob": -1}]}}]
    }
    assert completion_token_data(mismatched) == (None, [1, 2], None)


def test_segments_of_linear_turns_are_the_sequence() -> None:
    turns = three_turns()
    (segment,) = build_segments(turns, expected_turns=3)
    assert segment == build_sequence(turns, expected_turns=3)


def test_a_rewritten_history_starts_a_segment_and_a_turn_rejoins_the_segment_it_extends() -> None:
    """Turn 1 rewrote turn 0's history (a new system prompt); turn 2 extends turn 0's line again and
    turn 3 extends turn 1's (a program alternating between two conversations)."""
    raw = [([1, 2], [3]), ([9, 2, 3], [4]), ([1, 2, 3, 5], [6]), ([9, 2, 3, 4, 7], [8])]
    turns, prefix = [], None
    for i, (prompt, completion) in enumerate(raw):
        record, prefix = turn_tokens(
            turn=i, prompt_ids=prompt, completion_ids=completion, logprobs=[-0.5], prefix=prefix
        )
        turns.append(record)
    assert [t.extends for t in turns] == [None, False, False, False]
    with pytest.raises(TokenMismatch):
        build_sequence(turns, expected_turns=4)
    first, second = build_segments(turns, expected_turns=4)
    assert first.ids == [1, 2, 3, 5, 6] and first.loss_mask == [0, 0, 1, 0, 1]
    assert first.logprobs == [0.0, 0.0, -0.5, 0.0, -0.5]
    assert second.ids == [9, 2, 3, 4, 7, 8] and second.loss_mask == [0, 0, 0, 1, 0, 1]


def test_segments_need_every_turn() -> None:
    with pytest.raises(TokenDataError, match="covers turns"):
        build_segments(three_turns()[:2], expected_turns=3)
