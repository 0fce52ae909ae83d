"""The group-relative judge: one judge call per order scores a group's samples against each other.

Real groups of real rollouts on the dev server; the model and the judge are scripted HTTP endpoints.
The sampled model answers with its seed (sample i of a group has seed i), so which sample is best is
known; one judge scores by content, another by position only (the bias the orders must expose).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import pytest
from mcp_support import wait_until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from gymflow.activities.judge import GroupJudgeConfig
from gymflow.activities.model import ModelConfig
from gymflow.activities.names import SA_STATUS
from gymflow.activities.schema import GroupInput, GroupResult, RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.contract import Message, TerminationReason
from gymflow.envs.errors import JudgeParseError
from gymflow.envs.rewards.group_judge import combine, judge_orders, parse_group_reply, render_group_prompt, spearman
from gymflow.workers.servers.policy import AppServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import GroupRolloutWorkflow

ATTEMPT = re.compile(r"# Attempt (T\d+)\n<T\d+>\n(.*?)\n</T\d+>", re.S)


def chat(content: str, model: str = "scripted") -> JSONResponse:
    message = {"role": "assistant", "content": content}
    return JSONResponse({"model": model, "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


def seeded_model() -> Starlette:
    """Answers at once with its request's seed: sample i of a group answers i."""

    async def completions(request: Request) -> Response:
        body = await request.json()
        return chat(f"My answer: <answer>{body.get('seed')}</answer>")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def judge_app(mode: str, calls: list[list[str]], hold: asyncio.Event | None = None) -> Starlette:
    """`content`: scores each attempt 2 x its answer + 1; `position`: 10 for T1, 0 for the rest;
    `500`: fails. With `hold`, every call waits for it first (a judge step in flight)."""

    async def completions(request: Request) -> Response:
        body = await request.json()
        attempts = ATTEMPT.findall(body["messages"][-1]["content"])
        calls.append([text for _, text in attempts])
        if hold is not None:
            await hold.wait()
        if mode == "500":
            return PlainTextResponse("Internal Server Error", 500)
        if mode == "position":
            scores = {name: (10 if name == "T1" else 0) for name, _ in attempts}
        else:
            scores = {name: 2 * int(re.findall(r"<answer>(\d+)</answer>", text)[-1]) + 1 for name, text in attempts}
        return chat(json.dumps({"scores": scores, "best": max(scores, key=scores.__getitem__)}), model="judge")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


async def judged_group(
    client: Client, worker: RunningWorker, judge_mode: str, calls: list[list[str]], **config: Any
) -> GroupResult:
    task = generate_tasks(1, seed=7)[0]
    async with AppServer(seeded_model()) as model, AppServer(judge_app(judge_mode, calls)) as judge:
        template = RolloutInput(env="math-inproc", task=task, model=ModelConfig(base_url=model.url, seed=0))
        judging = GroupJudgeConfig(model=ModelConfig(base_url=judge.url, temperature=0.0), **config)
        return await client.execute_workflow(
            GroupRolloutWorkflow.run,
            GroupInput(rollout=template, n=4, group_judge=judging),
            id=f"group-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )


def answer_of(result: GroupResult, i: int) -> int:
    return int(re.findall(r"<answer>(\d+)</answer>", result.trajectories[i].messages[-1].content)[-1])


async def test_the_best_sample_ranks_first_whatever_order_the_judge_saw(client: Client, worker: RunningWorker) -> None:
    calls: list[list[str]] = []
    result = await judged_group(client, worker, "content", calls)
    judgement = result.judgement
    assert judgement is not None and result.infra_failed == 0 and not result.judge_note
    answers = [answer_of(result, i) for i in range(4)]
    assert sorted(answers) == [0, 1, 2, 3]
    assert answers[judgement.best] == 3, "the best answer ranks first"
    for i, score in enumerate(judgement.scores):
        assert score == pytest.approx(answers[i] / 3), "min-max within the group"
        reward = result.trajectories[i].reward
        assert reward is not None and reward.components["group/judge"] == pytest.approx(answers[i] / 3)
        assert result.rewards[i] == pytest.approx(reward.total)
    assert judgement.agreement == pytest.approx(1.0), "the position-swapped calls agree"
    assert len(calls) == 2 and calls[1] == calls[0][::-1], "the second call saw the group reversed"
    advantages = [a for a in result.advantages if a is not None]
    assert advantages[judgement.best] == max(advantages)


async def test_a_judge_that_ranks_by_position_is_caught_by_the_orders(client: Client, worker: RunningWorker) -> None:
    calls: list[list[str]] = []
    result = await judged_group(client, worker, "position", calls, min_agreement=0.5)
    judgement = result.judgement
    assert judgement is not None and judgement.agreement is not None and judgement.agreement < 0
    assert "min_agreement" in result.judge_note and "not used" in result.judge_note
    for trajectory in result.trajectories:
        assert trajectory.reward is not None and "group/judge" not in trajectory.reward.components


async def test_a_failing_judge_leaves_the_group_infra_failed_never_scored(
    client: Client, worker: RunningWorker
) -> None:
    calls: list[list[str]] = []
    result = await judged_group(client, worker, "500", calls, attempts=2)
    assert result.infra_failed == 4 and result.mean_reward is None and result.judgement is None
    assert all(r is None for r in result.rewards) and all(a is None for a in result.advantages)
    for trajectory in result.trajectories:
        assert trajectory.infra_failed and trajectory.termination == TerminationReason.REWARD_ERROR
        assert "group judge failed" in (trajectory.error or "")
    assert len(calls) == 4, "2 orders x 2 attempts, counted at the endpoint"


def test_orders_shuffle_then_reverse_and_are_seeded() -> None:
    orders = judge_orders(5, 3, seed=1)
    assert orders[1] == orders[0][::-1] and sorted(orders[2]) == list(range(5))
    assert judge_orders(5, 3, seed=1) == orders and judge_orders(5, 3, seed=2) != orders
    with pytest.raises(ValueError, match="at least one"):
        judge_orders(0, 2, seed=0)


def test_replies_are_read_by_label_and_mapped_back_to_the_group() -> None:
    order = [2, 0, 1]
    assert parse_group_reply('{"scores": {"T1": 9, "T2": 1, "T3": 5}}', order) == [1.0, 5.0, 9.0]
    assert parse_group_reply('Sure! ```json\n{"t1": 12, "T2": -3, "T3": "4"}\n```', order) == [0.0, 4.0, 10.0]
    listed = '{"scores": [{"label": "T1", "score": 2}, {"label": "T2", "score": 3}, {"label": "T3", "score": 4}]}'
    assert parse_group_reply(listed, order) == [3.0, 4.0, 2.0]
    with pytest.raises(JudgeParseError, match="no T3"):
        parse_group_reply('{"scores": {"T1": 1, "T2": 2}}', order)
    with pytest.raises(JudgeParseError, match="not a number"):
        parse_group_reply('{"scores": {"T1": "great", "T2": 2, "T3": 1}}', order)
    with pytest.raises(JudgeParseError, match="no JSON object"):
        parse_group_reply("they are all fine", order)


def test_combining_orders() -> None:
    agreed = combine([[1.0, 5.0, 9.0], [2.0, 4.0, 8.0]], [[0, 1, 2], [2, 1, 0]])
    assert agreed.scores == pytest.approx([0.0, 3 / 7, 1.0]) and agreed.best == 2 and agreed.agreement == 1.0
    tied = combine([[5.0, 5.0], [5.0, 5.0]], [[0, 1], [1, 0]])
    assert tied.scores == [0.5, 0.5] and tied.agreement == 1.0
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0) and spearman([1, 1, 1], [1, 2, 3]) == 0.0


def test_the_prompt_shows_each_attempt_under_its_label_in_order() -> None:
    transcripts = [[Message(role="assistant", content=f"attempt {i}")] for i in range(3)]
    messages = render_group_prompt("be right", prompt="add 2 and 2", transcripts=transcripts, order=[1, 2, 0])
    shown = ATTEMPT.findall(messages[-1].content)
    assert [name for name, _ in shown] == ["T1", "T2", "T3"]
    assert [text.split()[-1] for _, text in shown] == ["1", "2", "0"]
    assert "be right" in messages[-1].content and "add 2 and 2" in messages[-1].content


async def test_a_group_cancelled_in_its_judge_step_closes_cancelled(client: Client, worker: RunningWorker) -> None:
    """Cancelled while both judge calls are in flight: the group ends CANCELED with its final status,
    and its samples' rollouts are closed (they had finished; nothing of theirs is left running)."""
    calls: list[list[str]] = []
    hold = asyncio.Event()
    task = generate_tasks(1, seed=8)[0]
    async with AppServer(seeded_model()) as model, AppServer(judge_app("content", calls, hold)) as judge:
        template = RolloutInput(env="math-inproc", task=task, model=ModelConfig(base_url=model.url, seed=0))
        judging = GroupJudgeConfig(model=ModelConfig(base_url=judge.url, temperature=0.0))
        handle = await client.start_workflow(
            GroupRolloutWorkflow.run,
            GroupInput(rollout=template, n=3, group_judge=judging),
            id=f"group-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
        await wait_until(lambda: len(calls) == 2, what="both orders' judge calls in flight")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        hold.set()
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.CANCELED
    assert described.typed_search_attributes.get(SA_STATUS) == "cancelled"
    running = [
        e async for e in client.list_workflows(f'WorkflowId STARTS_WITH "{handle.id}/" AND ExecutionStatus = "Running"')
    ]
    assert running == []
