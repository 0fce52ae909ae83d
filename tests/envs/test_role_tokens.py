"""Rollouts of several roles, the pure half: what each role sees (gymflow.envs.wire.roles), one token
sequence and loss mask per role (gymflow.envs.wire.tokens.build_role_sequences), the contract's roles."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gymflow.envs.contract import BaseEnv, Message, TerminationReason, ToolCall, ToolResult, ToolSpec, Trajectory
from gymflow.envs.errors import TokenDataError, TokenMismatch
from gymflow.envs.wire import chat
from gymflow.envs.wire.roles import role_view
from gymflow.envs.wire.tokens import TurnTokens, build_role_sequences, build_segments, build_sequence, turn_tokens

CALL = ToolCall(id="call_0_0", name="add", arguments={"a": 2, "b": 2})
CONVERSATION = [
    Message(role="system", content="Solve it."),
    Message(role="user", content="2 + 2?"),
    Message(role="assistant", tool_calls=[CALL], speaker="solver"),
    Message(role="tool", content="4", tool_call_id="call_0_0", name="add"),
    Message(role="assistant", content="4.", speaker="solver"),
    Message(role="assistant", content="Show your work.", speaker="critic"),
]


def test_a_role_sees_its_own_turns_and_the_others_answers_as_user_messages() -> None:
    critic = role_view(CONVERSATION, "critic")
    assert [(m.role, m.content) for m in critic] == [
        ("system", "Solve it."),
        ("user", "2 + 2?"),
        ("user", "4."),  # the solver's answer; its tool call and the call's result are the solver's business
        ("assistant", "Show your work."),
    ]
    solver = role_view(CONVERSATION, "solver")
    assert solver[:5] == CONVERSATION[:5]  # its own turns untouched: its prompts extend what it generated
    assert (solver[5].role, solver[5].content, solver[5].speaker) == ("user", "Show your work.", None)


def test_the_speaker_is_recorded_but_never_sent_to_a_model_nor_written_when_unset() -> None:
    said = CONVERSATION[4]
    assert json.loads(said.model_dump_json())["speaker"] == "solver"
    assert "speaker" not in json.loads(Message(role="assistant", content="x").model_dump_json())
    for tool_format in ("native", "hermes"):
        wire = chat.render_messages(CONVERSATION, [], tool_format)
        assert all("speaker" not in m and "solver" not in json.dumps(m) for m in wire)


def recorded(turns: list[tuple[str, list[int], list[int]]]) -> list[TurnTokens]:
    """(speaker, whole prompt, completion) per turn, recorded as the model activity does: each role's
    prompt checked against that role's own previous prompt + completion."""
    prefixes: dict[str, Any] = {}
    records = []
    for number, (speaker, prompt, completion) in enumerate(turns):
        record, prefixes[speaker] = turn_tokens(
            turn=number,
            prompt_ids=prompt,
            completion_ids=completion,
            logprobs=[-0.5] * len(completion),
            prefix=prefixes.get(speaker),
            speaker=speaker,
        )
        records.append(record)
    return records


# The solver: [1,2] -> [3]; then [1,2,3,4] -> [5]. The critic between them: [1,2,9] -> [7,7]. Then the
# solver again: its own sequence + the critic's words [8] -> [6].
TURNS = [
    ("solver", [1, 2], [3]),
    ("solver", [1, 2, 3, 4], [5]),
    ("critic", [1, 2, 9], [7, 7]),
    ("solver", [1, 2, 3, 4, 5, 8], [6]),
]
SPEAKERS = [speaker for speaker, _, _ in TURNS]


def test_each_role_gets_its_own_sequence_with_a_mask_on_its_own_tokens() -> None:
    turns = recorded(TURNS)
    assert [t.extends for t in turns] == [None, True, None, True]  # each role extends its own turns
    sequences = build_role_sequences(turns, speakers=SPEAKERS)
    assert list(sequences) == ["solver", "critic"]
    solver, critic = sequences["solver"], sequences["critic"]
    assert solver.ids == [1, 2, 3, 4, 5, 8, 6]
    assert solver.loss_mask == [0, 0, 1, 0, 1, 0, 1]
    assert solver.logprobs == [0.0, 0.0, -0.5, 0.0, -0.5, 0.0, -0.5]
    assert critic.ids == [1, 2, 9, 7, 7]
    assert critic.loss_mask == [0, 0, 0, 1, 1]
    # A trainer of one role asks for that role alone.
    assert build_role_sequences(turns, speakers=SPEAKERS, roles=["critic"]) == {"critic": critic}


def test_a_role_whose_prompt_does_not_extend_its_own_previous_turn_is_reported() -> None:
    turns = recorded(TURNS)
    # The solver's last prompt rewritten (a template that drops history): recorded whole, extends=False.
    turns[3] = TurnTokens(turn=3, prompt_ids=[1, 2, 0, 4, 5, 8], prompt_length=6, completion_ids=[6],
                          extends=False, speaker="solver")  # fmt: skip
    with pytest.raises(TokenMismatch, match=r"turn 3's prompt does not extend turn 1's .* at token 2 \(expected 3"):
        build_role_sequences(turns, speakers=SPEAKERS)
    assert set(build_role_sequences(turns, speakers=SPEAKERS, roles=["critic"])) == {"critic"}


def test_missing_or_mislabelled_token_data_is_an_error_for_the_role_that_lacks_it() -> None:
    turns = recorded(TURNS)
    without_critic = [t for t in turns if t.speaker != "critic"]  # a frozen critic served without token ids
    with pytest.raises(TokenDataError, match=r"role 'critic'.s turn\(s\) \[2\] have no token data"):
        build_role_sequences(without_critic, speakers=SPEAKERS)
    assert build_role_sequences(without_critic, speakers=SPEAKERS, roles=["solver"])["solver"].ids[-1] == 6
    with pytest.raises(TokenDataError, match="turn 2's token data names role 'critic', its turn 'solver'"):
        build_role_sequences(turns, speakers=["solver"] * 4)
    with pytest.raises(TokenDataError, match="role 'judge' played no turn"):
        build_role_sequences(turns, speakers=SPEAKERS, roles=["judge"])


def test_one_sequence_of_several_roles_is_refused_not_glued() -> None:
    turns = recorded(TURNS)
    for build in (build_sequence, build_segments):
        with pytest.raises(TokenDataError, match=r"played by roles \['critic', 'solver'\].*role_sequences"):
            build(turns)


def test_a_trajectory_gives_its_role_sequences() -> None:
    trajectory = Trajectory(rollout_id="r", task_id="t", env="e", termination=TerminationReason.FINAL_ANSWER,
                            messages=[], turns=4, tokens=recorded(TURNS), speakers=SPEAKERS)  # fmt: skip
    assert trajectory.role_sequences("critic")["critic"].ids == [1, 2, 9, 7, 7]
    again = Trajectory.model_validate_json(trajectory.model_dump_json())
    assert again.role_sequences() == trajectory.role_sequences()
    plain = trajectory.model_copy(update={"speakers": [], "tokens": []})
    assert "speakers" not in json.loads(plain.model_dump_json())
    with pytest.raises(TokenDataError, match="played by one policy: use token_sequence"):
        plain.role_sequences()


class Debate(BaseEnv):
    roles = ("pro", "con", "judge")

    async def list_tools(self) -> list[ToolSpec]:
        return []

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        raise NotImplementedError

    async def compute_reward(self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any) -> Any:
        return 0.0


async def test_by_default_each_role_speaks_once_in_the_declared_order() -> None:
    env = Debate()
    said = [Message(role="user", content="Tabs or spaces?"), Message(role="assistant", content="Tabs.", speaker="pro")]
    order = ["pro"]  # the first role opens the rollout; the env is asked after each final answer
    while (role := await env.next_role("r", said)) is not None:
        order.append(role)
        said.append(Message(role="assistant", content="...", speaker=role))
    assert order == ["pro", "con", "judge"]


def test_roles_must_be_distinct_names() -> None:
    with pytest.raises(TypeError, match="roles must be distinct non-empty names"):
        type("Twice", (Debate,), {"roles": ("a", "a")})
