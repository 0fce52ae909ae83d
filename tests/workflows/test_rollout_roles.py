"""Rollouts of several roles on the dev server: a solver and its critic, each its own model behind its
own OpenAI-compatible endpoint that returns token ids; each role's token sequence and loss mask are
checked token by token against the byte-level ChatML template (gymflow.workers.servers.byte_tokens),
written out here by hand. A role the rollout names but the env lacks fails the rollout (InvalidInput);
a next speaker the env never declared ends it as an env failure, not a guess.
"""

from __future__ import annotations

import pytest
from roles_support import ADD, task
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from gymflow.activities import errors
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.activities.session_schema import SessionInput
from gymflow.envs.contract import Message, TerminationReason
from gymflow.envs.errors import TokenDataError
from gymflow.envs.wire.chat import render_tools_block
from gymflow.envs.wire.tokens import TokenSequence
from gymflow.workers.cli.inspect import inspect_workflow
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.sdk.sessions import start_session
from gymflow.workers.servers.byte_tokens import encode
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call

SOLVER = ScriptedPolicy(  # counts the assistant turns it sees: its own
    [
        Message(role="assistant", tool_calls=[call("add", {"a": 2, "b": 2})]),
        Message(role="assistant", content="The answer is 4."),
        Message(role="assistant", content="2 + 2 = 4, so the answer is 4."),
    ]
)
CRITIC = ScriptedPolicy([Message(role="assistant", content="Correct, but show your work.")])


def masked(*parts: tuple[str, int]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of template text, part by part (1: the role's model wrote it)."""
    ids: list[int] = []
    mask: list[int] = []
    for text, bit in parts:
        tokens = encode(text)
        ids += tokens
        mask += [bit] * len(tokens)
    return ids, mask


def assert_exact(sequence: TokenSequence, expected: tuple[list[int], list[int]]) -> None:
    assert sequence.ids == expected[0]
    assert sequence.loss_mask == expected[1]
    assert sequence.logprobs is not None and len(sequence.logprobs) == len(sequence.ids)


async def test_each_role_gets_its_own_exact_token_sequence_and_mask(client: Client, worker: RunningWorker) -> None:
    async with PolicyServer(SOLVER, record_tokens=True) as solver, PolicyServer(CRITIC, record_tokens=True) as critic:
        # --8<-- [start:rollout]
        rollout = RolloutInput(
            env="solver-critic",
            task=task(),
            model=ModelConfig(base_url=solver.url, model="solver-7b", tokens="vllm"),  # the trained policy
            roles={"critic": ModelConfig(base_url=critic.url, model="critic-70b", tokens="vllm")},
        )
        # --8<-- [end:rollout]
        handle = await start_rollout(client, rollout, task_queue=worker.task_queue)
        trajectory = await handle.result()
    assert trajectory.termination == TerminationReason.FINAL_ANSWER and trajectory.reward is not None
    assert trajectory.reward.total == 1.0
    assert trajectory.speakers == ["solver", "solver", "critic", "solver"]
    said = [(m.speaker, m.content) for m in trajectory.messages if m.role == "assistant"]
    assert said == [
        ("solver", ""),
        ("solver", "The answer is 4."),
        ("critic", "Correct, but show your work."),
        ("solver", "2 + 2 = 4, so the answer is 4."),
    ]
    assert [len(solver.records), len(critic.records)] == [3, 1]  # each role's turns went to its own endpoint
    assert [t.speaker for t in trajectory.tokens] == trajectory.speakers
    assert [t.extends for t in trajectory.tokens] == [None, True, None, True]  # each extends its own turns

    # --8<-- [start:train]
    sequences = trajectory.role_sequences()  # {"solver": TokenSequence, "critic": TokenSequence}
    solver_only = trajectory.role_sequences("solver")["solver"]  # a trainer of the solver alone
    # --8<-- [end:train]
    assert solver_only == sequences["solver"]
    head = (
        "<|im_start|>system\nSolve the task. A critic reviews the answer.\n\n"
        + render_tools_block([ADD])
        + "<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
    )
    assert_exact(
        sequences["solver"],
        masked(
            (head + "<|im_start|>assistant\n", 0),
            ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>', 1),
            ("\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n", 0),
            ("The answer is 4.<|im_end|>", 1),
            ("\n<|im_start|>user\nCorrect, but show your work.<|im_end|>\n<|im_start|>assistant\n", 0),
            ("2 + 2 = 4, so the answer is 4.<|im_end|>", 1),
        ),
    )
    # The critic reads the solver's answer as a user message; the solver's tool call and its result are not its own.
    assert_exact(
        sequences["critic"],
        masked(
            (head + "<|im_start|>user\nThe answer is 4.<|im_end|>\n<|im_start|>assistant\n", 0),
            ("Correct, but show your work.<|im_end|>", 1),
        ),
    )
    with pytest.raises(TokenDataError, match="role_sequences"):
        trajectory.token_sequence()  # two roles never glue into one sequence

    # The Web UI's activity summaries and `gymflow inspect` name the role of every model turn.
    inspection = await inspect_workflow(client, handle.id, run_id=None, ui_url="http://ui")
    turns = [step.summary for step in inspection.steps if step.activity == "generate"]
    assert turns == ["solver: solver-7b turn 1", "solver: solver-7b turn 2", "critic: critic-70b turn 3",
                     "solver: solver-7b turn 4"]  # fmt: skip


async def test_an_env_that_also_answers_speaks_after_naming_the_next_role(
    client: Client, worker: RunningWorker
) -> None:
    async with PolicyServer(SOLVER) as solver, PolicyServer(CRITIC) as critic:
        rollout = RolloutInput(
            env="solver-critic-hosted",
            task=task(),
            model=ModelConfig(base_url=solver.url),
            roles={"critic": ModelConfig(base_url=critic.url)},
        )
        trajectory = await (await start_rollout(client, rollout, task_queue=worker.task_queue)).result()
    host = "Over to the next speaker."
    assert [(m.role, m.speaker, m.content) for m in trajectory.messages if m.role in ("user", "assistant")][2:] == [
        ("assistant", "solver", "The answer is 4."),
        ("user", None, host),
        ("assistant", "critic", "Correct, but show your work."),
        ("user", None, host),
        ("assistant", "solver", "2 + 2 = 4, so the answer is 4."),
    ]
    assert trajectory.termination == TerminationReason.FINAL_ANSWER and trajectory.speakers[-1] == "solver"


async def test_a_role_the_env_does_not_declare_fails_the_rollout_as_invalid_input(
    client: Client, worker: RunningWorker
) -> None:
    for env, named in [("solver-critic", "'judge'"), ("solver-alone", "none, it is played by one policy")]:
        handle = await start_rollout(
            client,
            RolloutInput(env=env, task=task(), roles={"judge": ModelConfig(base_url="http://127.0.0.1:9/v1")}),
            task_queue=worker.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        cause = failed.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == errors.INVALID_INPUT and cause.non_retryable
        assert f"roles: env {env!r} declares no role 'judge'" in cause.message and named in cause.message


async def test_a_next_speaker_the_env_never_declared_ends_the_rollout_as_an_env_failure(
    client: Client, worker: RunningWorker
) -> None:
    async with PolicyServer(SOLVER) as solver:
        model = ModelConfig(base_url=solver.url)
        handle = await start_rollout(
            client, RolloutInput(env="solver-critic-impostor", task=task(), model=model), task_queue=worker.task_queue
        )
        trajectory = await handle.result()
    assert trajectory.infra_failed and trajectory.termination == TerminationReason.ENV_ERROR
    assert trajectory.reward is None and trajectory.error is not None
    assert "next_role named role 'judge', which it does not declare (roles: solver, critic)" in trajectory.error
    inspection = await inspect_workflow(client, handle.id, run_id=None, ui_url="http://ui")
    asked = [step for step in inspection.steps if step.activity == "env_response"]
    assert [step.attempts for step in asked] == [1]  # the env's bug: not retried


async def test_a_session_refuses_an_env_of_roles_as_invalid_input(client: Client, worker: RunningWorker) -> None:
    session = await start_session(client, SessionInput(env="solver-critic", task=task()), task_queue=worker.task_queue)
    with pytest.raises(WorkflowFailureError) as failed:
        await session.handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == errors.INVALID_INPUT
    assert "played by several roles (solver, critic); a session plays one policy" in cause.message
