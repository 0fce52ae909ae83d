"""gymflow.activities.judge: the judge activity over real HTTP, its error mapping, and retries on a real server."""

from __future__ import annotations

import json
import socket
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from gymflow.activities.errors import CONTEXT_LENGTH, JUDGE_ERROR, JUDGE_REJECTED, JUDGE_REPLY_INVALID
    from gymflow.activities.judge import JudgeActivities, JudgeInput, JudgeResult
    from gymflow.activities.model import ModelConfig
    from gymflow.envs.contract import Message, Wire
    from gymflow.envs.wire.rubric import Criterion, Rubric
    from gymflow.workers.judge_worker import judge_worker
    from gymflow.workers.sandbox_runner import workflow_runner
    from gymflow.workers.servers.policy import AppServer

API_KEY = "sk-judge-5ecret-do-not-leak"
RUBRIC = Rubric(
    criteria=[
        Criterion(name="correct", description="The answer is 5."),
        Criterion(name="clarity", description="Clear.", kind="ranged", scale_max=5),
        Criterion(name="fabrication", description="Invents a source.", polarity="negative"),
    ]
)
SCORES = {"correct": 1.0, "clarity": 4.0, "fabrication": 0.0}
GOOD_REPLY = json.dumps({"scores": {k: {"reason": f"{k} ok", "score": v} for k, v in SCORES.items()}})


def _completion(content: str | None) -> dict[str, Any]:
    return {
        "model": "judge-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
    }


class JudgeServer:
    """A judge endpoint whose path picks its behaviour; requests are counted per path key."""

    def __init__(self) -> None:
        self.requests: dict[str, list[tuple[dict[str, str], Any]]] = defaultdict(list)
        route = Route("/{key}/{mode}/v1/chat/completions", self.handle, methods=["POST"])
        self.app = Starlette(routes=[route])

    async def handle(self, request: Request) -> Response:
        key, mode = request.path_params["key"], request.path_params["mode"]
        self.requests[key].append((dict(request.headers), await request.json()))
        count = len(self.requests[key])
        if mode == "ok":
            return JSONResponse(_completion(GOOD_REPLY))
        if mode == "garbage":
            return JSONResponse(_completion("The response looks fine to me, well done!"))
        if mode == "flaky":  # garbage twice, then a proper verdict
            return JSONResponse(_completion(GOOD_REPLY if count > 2 else "Score: great."))
        if mode == "out-of-range":
            return JSONResponse(_completion('{"correct": 1, "clarity": 9, "fabrication": 0}'))
        if mode == "no-content":
            return JSONResponse(_completion(None))
        if mode == "html":
            return PlainTextResponse("<html>upstream restarting</html>", 200)
        if mode == "429":
            return JSONResponse({"error": {"message": "rate limited"}}, 429, headers={"Retry-After": "7"})
        if mode == "500":
            return PlainTextResponse("Internal Server Error", 500)
        if mode == "401":  # echoes the credentials, as careless servers do
            return JSONResponse({"error": f"bad key: {request.headers.get('authorization')}"}, 401)
        if mode == "context":
            return JSONResponse({"message": "This model's maximum context length is 8192 tokens."}, 400)
        return PlainTextResponse("no such mode", 404)


@pytest.fixture(scope="module")
async def judge_server() -> AsyncIterator[tuple[JudgeServer, str]]:
    server = JudgeServer()
    async with AppServer(server.app) as running:
        yield server, f"http://127.0.0.1:{running.port}"


@pytest.fixture
async def judge() -> AsyncIterator[JudgeActivities]:
    activities = JudgeActivities(default_base_url=None, default_model="default-judge", api_key=API_KEY)
    yield activities
    await activities.aclose()


def _input(base_url: str | None, **fields: Any) -> JudgeInput:
    return JudgeInput(
        rubric=RUBRIC,
        prompt="What is 2+3?",
        transcript=[Message(role="assistant", content="<answer>5</answer>")],
        ground_truth="5",
        model=ModelConfig(base_url=base_url, temperature=0.0),
        **fields,
    )


def _url(root: str, mode: str) -> tuple[str, str]:
    key = uuid.uuid4().hex[:8]
    return key, f"{root}/{key}/{mode}/v1"


async def _failure(judge: JudgeActivities, input: JudgeInput) -> ApplicationError:
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(judge.judge, input)
    return raised.value


async def test_good_reply(judge: JudgeActivities, judge_server: tuple[JudgeServer, str]) -> None:
    server, root = judge_server
    key, url = _url(root, "ok")
    result = await ActivityEnvironment().run(judge.judge, _input(url, json_mode=True))
    assert result.verdict.scores == SCORES
    assert result.verdict.reasons["clarity"] == "clarity ok"
    assert result.reward.total == pytest.approx((1 + 0.8 - 0) / 2)
    assert result.reward.components == SCORES
    assert (result.model, result.usage.prompt_tokens, result.usage.completion_tokens) == ("judge-model", 120, 30)
    [(headers, body)] = server.requests[key]
    assert headers["authorization"] == f"Bearer {API_KEY}"
    assert body["model"] == "default-judge"
    assert (body["temperature"], body["response_format"]) == (0.0, {"type": "json_object"})
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "<answer>5</answer>" in body["messages"][1]["content"]
    assert "<reference>\n5\n</reference>" in body["messages"][1]["content"]


async def test_worker_default_endpoint_and_no_key(judge_server: tuple[JudgeServer, str]) -> None:
    server, root = judge_server
    key, url = _url(root, "ok")
    activities = JudgeActivities(default_base_url=url, default_model="")
    try:
        result = await ActivityEnvironment().run(activities.judge, _input(None))
    finally:
        await activities.aclose()
    assert result.verdict.scores == SCORES
    [(headers, body)] = server.requests[key]
    assert "authorization" not in headers
    assert "model" not in body and "response_format" not in body


@pytest.mark.parametrize(
    ("mode", "fields", "expected"),
    [
        ("garbage", {}, (JUDGE_REPLY_INVALID, False, None)),
        ("no-content", {}, (JUDGE_REPLY_INVALID, False, None)),
        ("out-of-range", {"out_of_range": "error"}, (JUDGE_REPLY_INVALID, False, None)),
        ("429", {}, (JUDGE_ERROR, False, timedelta(seconds=7))),
        ("500", {}, (JUDGE_ERROR, False, None)),
        ("html", {}, (JUDGE_ERROR, False, None)),
        ("401", {}, (JUDGE_REJECTED, True, None)),
        ("context", {}, (CONTEXT_LENGTH, True, None)),
    ],
)
async def test_errors(
    judge: JudgeActivities,
    judge_server: tuple[JudgeServer, str],
    mode: str,
    fields: dict[str, Any],
    expected: tuple[str, bool, timedelta | None],
) -> None:
    _, root = judge_server
    error = await _failure(judge, _input(_url(root, mode)[1], **fields))
    assert (error.type, error.non_retryable, error.next_retry_delay) == expected
    assert API_KEY not in str(error)


async def test_unusable_reply_names_the_problem(judge: JudgeActivities, judge_server: tuple[JudgeServer, str]) -> None:
    _, root = judge_server
    error = await _failure(judge, _input(_url(root, "garbage")[1]))
    assert "no JSON object scoring the criteria correct, clarity, fabrication" in error.message
    assert "well done" in error.message  # an excerpt of the reply
    error = await _failure(judge, _input(_url(root, "out-of-range")[1], out_of_range="error"))
    assert r"clarity: 9 is not in 0..5" in error.message


async def test_clamped_scores_are_recorded(judge: JudgeActivities, judge_server: tuple[JudgeServer, str]) -> None:
    _, root = judge_server
    result = await ActivityEnvironment().run(judge.judge, _input(_url(root, "out-of-range")[1]))
    assert result.verdict.scores["clarity"] == 5.0
    assert result.verdict.clamped == {"clarity": 9.0}


async def test_rejection_hides_the_key(judge: JudgeActivities, judge_server: tuple[JudgeServer, str]) -> None:
    _, root = judge_server
    error = await _failure(judge, _input(_url(root, "401")[1]))
    assert "judge endpoint returned HTTP 401" in error.message
    assert "bad key: Bearer ***" in error.message


@pytest.mark.parametrize("base_url", [None, "localhost:9/v1"])
async def test_missing_or_invalid_endpoint(judge: JudgeActivities, base_url: str | None) -> None:
    error = await _failure(judge, _input(base_url))
    assert (error.type, error.non_retryable) == (JUDGE_REJECTED, True)
    assert "JudgeInput.model.base_url" in error.message


async def test_closed_port_is_retryable(judge: JudgeActivities) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = await _failure(judge, _input(f"http://127.0.0.1:{port}/v1"))
    assert (error.type, error.non_retryable) == (JUDGE_ERROR, False)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan")])
async def test_judge_worker_rejects_bad_rates(client: Client, judge: JudgeActivities, rate: float) -> None:
    with pytest.raises(ValueError, match="rate_per_second"):
        judge_worker(client, activities=judge, rate_per_second=rate)


# -- through Temporal: the workflow's RetryPolicy bounds the attempts ---------------------------


class JudgeOnceInput(Wire):
    judge: JudgeInput
    judge_queue: str


class JudgeOnceResult(Wire):
    result: JudgeResult | None = None
    error_type: str | None = None
    retry_state: str | None = None


@workflow.defn(name="JudgeOnceTestWorkflow")
class JudgeOnceWorkflow:
    """Judge once on the judge queue with at most 3 attempts; report the result or the error type."""

    @workflow.run
    async def run(self, input: JudgeOnceInput) -> JudgeOnceResult:
        try:
            result = await workflow.execute_activity_method(
                JudgeActivities.judge,
                input.judge,
                task_queue=input.judge_queue,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(
                    maximum_attempts=3, initial_interval=timedelta(milliseconds=50), backoff_coefficient=1.0
                ),
            )
        except ActivityError as exc:
            cause = exc.cause
            return JudgeOnceResult(
                error_type=cause.type if isinstance(cause, ApplicationError) else None,
                retry_state=exc.retry_state.name if exc.retry_state is not None else None,
            )
        return JudgeOnceResult(result=result)


async def _judge_once(client: Client, url: str) -> tuple[JudgeOnceResult, str]:
    queue, judge_queue = f"test-{uuid.uuid4().hex[:10]}", f"test-judge-{uuid.uuid4().hex[:10]}"
    activities = JudgeActivities(default_base_url=None, api_key=API_KEY)
    workflow_id = f"judge-{uuid.uuid4().hex[:10]}"
    try:
        async with (
            Worker(client, task_queue=queue, workflows=[JudgeOnceWorkflow], workflow_runner=workflow_runner()),
            judge_worker(client, activities=activities, rate_per_second=100, task_queue=judge_queue),
        ):
            result = await client.execute_workflow(
                JudgeOnceWorkflow.run,
                JudgeOnceInput(judge=_input(url), judge_queue=judge_queue),
                id=workflow_id,
                task_queue=queue,
                execution_timeout=timedelta(seconds=60),
            )
    finally:
        await activities.aclose()
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return result, history.to_json()


async def test_workflow_gets_a_typed_error_after_exactly_three_attempts(
    client: Client, judge_server: tuple[JudgeServer, str]
) -> None:
    server, root = judge_server
    key, url = _url(root, "500")
    outcome, history = await _judge_once(client, url)
    assert outcome.result is None
    assert (outcome.error_type, outcome.retry_state) == (JUDGE_ERROR, "MAXIMUM_ATTEMPTS_REACHED")
    assert len(server.requests[key]) == 3
    assert API_KEY not in history


async def test_workflow_gets_scores_after_two_garbage_replies(
    client: Client, judge_server: tuple[JudgeServer, str]
) -> None:
    server, root = judge_server
    key, url = _url(root, "flaky")
    outcome, history = await _judge_once(client, url)
    assert outcome.error_type is None and outcome.result is not None
    assert outcome.result.verdict.scores == SCORES
    assert outcome.result.reward.total == pytest.approx(0.9)
    assert len(server.requests[key]) == 3
    assert API_KEY not in history
