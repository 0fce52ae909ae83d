"""Rubric rewards through the judge activity inside real rollouts and batches."""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from temporalio.client import Client

from gymflow.activities.judge import JudgeConfig
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, RolloutOptions
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.contract import TerminationReason
from gymflow.envs.wire.rubric import Criterion, Rubric
from gymflow.workers.servers.policy import AppServer, PolicyServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import BatchRolloutWorkflow
from support import play

RUBRIC = Rubric(
    criteria=[
        Criterion(name="uses_tools", description="Every arithmetic step was done with a tool call."),
        Criterion(name="rude", description="The assistant is rude.", polarity="negative"),
    ]
)


def judge_app(mode: str, calls: list[Any]) -> Starlette:
    async def completions(request: Request) -> Response:
        calls.append(await request.json())
        if mode == "500":
            return PlainTextResponse("Internal Server Error", 500)
        content = json.dumps({"scores": {"uses_tools": 1, "rude": 0}})
        body = {"model": "judge", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        return JSONResponse(body)

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


async def test_judged_rollout_adds_rubric_components(client: Client, worker: RunningWorker) -> None:
    calls: list[Any] = []
    async with AppServer(judge_app("ok", calls)) as judge:
        config = JudgeConfig(rubric=RUBRIC, model=ModelConfig(base_url=judge.url, temperature=0.0), weight=0.5)
        task = generate_tasks(1, seed=31)[0]
        result = await play(client, worker, CalculatorPolicy(), env="math-inproc", task=task, judge=config)
    assert result.reward is not None and not result.infra_failed
    assert result.reward.components["judge/uses_tools"] == 1.0 and result.reward.components["judge/rude"] == 0.0
    assert result.reward.total == 1.0 + 0.5 * 1.0  # env reward + weight x judge total
    (request,) = calls
    prompt = "\n".join(m["content"] for m in request["messages"])
    assert "uses_tools" in prompt and task.prompt.splitlines()[0] in prompt  # type: ignore[union-attr]


async def test_failing_judge_is_a_typed_infra_failure_and_the_batch_survives(
    client: Client, worker: RunningWorker
) -> None:
    calls: list[Any] = []
    async with AppServer(judge_app("500", calls)) as judge, PolicyServer(CalculatorPolicy()) as policy:
        config = JudgeConfig(rubric=RUBRIC, model=ModelConfig(base_url=judge.url), attempts=2)
        result = await play(
            client, worker, CalculatorPolicy(), env="math-inproc", task=generate_tasks(1, seed=32)[0], judge=config
        )
        assert result.termination == TerminationReason.REWARD_ERROR
        assert result.infra_failed and result.reward is None and "judge failed" in (result.error or "")
        assert len(calls) == 2  # bounded retries, counted at the endpoint

        batch = await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env="math-inproc",
                tasks=generate_tasks(3, seed=33),
                options=RolloutOptions(model=ModelConfig(base_url=policy.url), judge=config),
            ),
            id=f"batch-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
    assert batch.total == 3 and batch.infra_failed == 3 and batch.mean_reward is None
