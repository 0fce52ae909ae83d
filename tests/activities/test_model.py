"""gymflow.activities.model: the generate activity over real HTTP, its request body and its error mapping."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from gymflow.activities.chat_endpoint import retry_after
from gymflow.activities.errors import CONTEXT_LENGTH, MODEL_ERROR, MODEL_REJECTED
from gymflow.activities.model import GenerateInput, GenerateResult, ModelActivities, ModelConfig
from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.workers.servers.policy import AppServer, PolicyServer

API_KEY = "sk-test-5ecret-do-not-leak"
ADD = ToolSpec(name="add", description="Add.", input_schema={"type": "object", "properties": {"a": {}, "b": {}}})
COMPLETION = {
    "model": "served-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13},
}


class Scripted(Policy):
    """add(2, 3), then the answer; a user message saying "broken" gets a call with broken JSON."""

    name = "scripted"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        assert [t.name for t in tools] == ["add"]
        last = messages[-1]
        if last.role == "tool":
            return Message(role="assistant", content=f"It is {last.content}.")
        if "broken" in last.content:
            call = ToolCall(id="b", name="add", raw_arguments='{"a": 2,', parse_error="on purpose")
            return Message(role="assistant", tool_calls=[call])
        return Message(role="assistant", tool_calls=[ToolCall(id="p", name="add", arguments={"a": 2, "b": 3})])


class Faults:
    """A starlette app whose path prefix picks the answer; it records every request it gets."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.release = asyncio.Event()
        self.app = Starlette(routes=[Route("/{fault}/v1/chat/completions", self.handle, methods=["POST"])])

    async def handle(self, request: Request) -> Response:
        self.requests.append((dict(request.headers), await request.json()))
        fault = request.path_params["fault"]
        if fault == "ok":
            return JSONResponse(COMPLETION)
        if fault == "slow":
            await self.release.wait()
            return JSONResponse(COMPLETION)
        if fault == "429":
            return JSONResponse({"error": {"message": "slow down"}}, 429, headers={"Retry-After": "7"})
        if fault == "500":
            return PlainTextResponse("Internal Server Error", 500)
        if fault == "context":
            message = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."
            return JSONResponse({"object": "error", "message": message, "code": 400}, 400)
        if fault == "401":  # echoes the credentials, as careless servers do
            return JSONResponse({"error": f"bad key: {request.headers.get('authorization')}"}, 401)
        if fault == "garbage":
            return PlainTextResponse("<html>upstream restarting</html>", 200)
        if fault == "no-choices":
            return JSONResponse({"choices": []})
        return PlainTextResponse("no such fault", 404)


@pytest.fixture(scope="module")
async def policy_server() -> AsyncIterator[PolicyServer]:
    async with PolicyServer(Scripted()) as server:
        yield server


@pytest.fixture(scope="module")
async def faults() -> AsyncIterator[tuple[Faults, str]]:
    app = Faults()
    async with AppServer(app.app) as server:
        yield app, f"http://127.0.0.1:{server.port}"


@pytest.fixture
async def model() -> AsyncIterator[ModelActivities]:
    activities = ModelActivities(default_base_url=None, api_key=API_KEY)
    yield activities
    await activities.aclose()


def _input(
    base_url: str | None, *, messages: list[Message] | None = None, turn: int = 1, **config: Any
) -> GenerateInput:
    return GenerateInput(
        model=ModelConfig(base_url=base_url, **config),
        messages=messages or [Message(role="system", content="Be brief."), Message(role="user", content="2+3?")],
        tools=[ADD],
        rollout_id="r1",
        turn=turn,
    )


async def _generate(model: ModelActivities, input: GenerateInput) -> GenerateResult:
    return await ActivityEnvironment().run(model.generate, input)


async def _failure(model: ModelActivities, input: GenerateInput) -> ApplicationError:
    with pytest.raises(ApplicationError) as raised:
        await _generate(model, input)
    return raised.value


@pytest.mark.parametrize("tool_format", ["native", "hermes"])
async def test_two_turns_against_policy_server(
    model: ModelActivities, policy_server: PolicyServer, tool_format: str
) -> None:
    first = await _generate(model, _input(policy_server.url, tool_format=tool_format, turn=1))
    [call] = first.message.tool_calls
    assert (call.name, call.arguments, call.parse_error) == ("add", {"a": 2, "b": 3}, None)
    assert first.finish_reason == ("tool_calls" if tool_format == "native" else "stop")
    assert first.model == "scripted"
    assert first.usage.prompt_tokens > 0
    assert first.usage.last_prompt_tokens == first.usage.prompt_tokens
    if tool_format == "hermes":
        assert call.id == "call_1_0"
        assert "<tool_call>" in first.message.content  # the model's own text stays in the transcript

    transcript = [*_input(None).messages, first.message, Message(role="tool", content="5", tool_call_id=call.id)]
    second = await _generate(model, _input(policy_server.url, messages=transcript, tool_format=tool_format, turn=2))
    assert second.message == Message(role="assistant", content="It is 5.")
    assert second.finish_reason == "stop"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.parametrize("tool_format", ["native", "hermes"])
async def test_malformed_call_is_kept(model: ModelActivities, policy_server: PolicyServer, tool_format: str) -> None:
    messages = [Message(role="user", content="broken please")]
    result = await _generate(model, _input(policy_server.url, messages=messages, tool_format=tool_format))
    [call] = result.message.tool_calls
    assert call.name == "add"
    assert call.parse_error is not None
    assert call.raw_arguments is not None
    assert '{"a": 2,' in call.raw_arguments


async def test_request_body(model: ModelActivities, faults: tuple[Faults, str]) -> None:
    app, root = faults
    config: dict[str, Any] = {"temperature": 0.5, "seed": 3, "stop": ["END"], "extra_body": {"top_k": 20}}
    result = await _generate(model, _input(f"{root}/ok/v1", **config))
    assert result.usage.model_dump() == {"prompt_tokens": 11, "completion_tokens": 2, "last_prompt_tokens": 11}
    assert result.model == "served-model"
    headers, body = app.requests[-1]
    assert headers["authorization"] == f"Bearer {API_KEY}"
    assert body["tools"] == [ADD.to_openai()]
    assert "model" not in body  # no model named anywhere: the server's only model
    assert (body["temperature"], body["seed"], body["stop"], body["top_k"], body["max_tokens"]) == (
        0.5,
        3,
        ["END"],
        20,
        1024,
    )
    assert "top_p" not in body

    await _generate(model, _input(f"{root}/ok/v1", tool_format="hermes", model="qwen"))
    _, body = app.requests[-1]
    assert "tools" not in body
    assert body["model"] == "qwen"
    assert "<tools>" in body["messages"][0]["content"]


async def test_worker_defaults_and_no_key(faults: tuple[Faults, str]) -> None:
    app, root = faults
    activities = ModelActivities(default_base_url=f"{root}/ok/v1", default_model="default-model")
    try:
        await _generate(activities, _input(None))
    finally:
        await activities.aclose()
    headers, body = app.requests[-1]
    assert "authorization" not in headers
    assert body["model"] == "default-model"


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("429", (MODEL_ERROR, False, timedelta(seconds=7))),
        ("500", (MODEL_ERROR, False, None)),
        ("context", (CONTEXT_LENGTH, True, None)),
        ("401", (MODEL_REJECTED, True, None)),
        ("garbage", (MODEL_ERROR, False, None)),  # a bad 200 is likely transient: retried
        ("no-choices", (MODEL_ERROR, False, None)),
    ],
)
async def test_http_errors(
    model: ModelActivities, faults: tuple[Faults, str], fault: str, expected: tuple[str, bool, timedelta | None]
) -> None:
    _, root = faults
    error = await _failure(model, _input(f"{root}/{fault}/v1"))
    assert (error.type, error.non_retryable, error.next_retry_delay) == expected
    assert API_KEY not in str(error)


async def test_rejection_names_status_and_hides_key(model: ModelActivities, faults: tuple[Faults, str]) -> None:
    app, root = faults
    error = await _failure(model, _input(f"{root}/401/v1"))
    assert app.requests[-1][0]["authorization"] == f"Bearer {API_KEY}"  # sent, and echoed back...
    assert "HTTP 401" in error.message
    assert "bad key: Bearer ***" in error.message  # ...but scrubbed from the error


async def test_closed_port_is_retryable(model: ModelActivities) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    error = await _failure(model, _input(f"http://127.0.0.1:{port}/v1"))
    assert error.type == MODEL_ERROR
    assert not error.non_retryable


async def test_request_timeout_is_retryable(model: ModelActivities, faults: tuple[Faults, str]) -> None:
    app, root = faults
    app.release.clear()  # the slow server never answers
    error = await _failure(model, _input(f"{root}/slow/v1", request_timeout_s=0.2))
    assert (error.type, error.non_retryable) == (MODEL_ERROR, False)
    assert "TimeoutError" in error.message


@pytest.mark.parametrize("base_url", [None, "localhost:8000/v1", "ftp://host/v1", "http:///v1", "http://[::1/v1"])
async def test_missing_or_invalid_endpoint(model: ModelActivities, base_url: str | None) -> None:
    error = await _failure(model, _input(base_url))
    assert error.type == MODEL_REJECTED
    assert error.non_retryable
    assert "base_url" in error.message


async def test_heartbeats_while_waiting(model: ModelActivities, faults: tuple[Faults, str]) -> None:
    app, root = faults
    app.release.clear()
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.3))
    env.on_heartbeat = lambda *details: app.release.set()  # the slow server answers once we heartbeat
    result = await asyncio.wait_for(env.run(model.generate, _input(f"{root}/slow/v1")), timeout=10)
    assert result.message.content == "hi"
    assert app.release.is_set()


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("3", 3.0),
        ("1.5", 1.5),
        ("-4", 0.0),
        ("inf", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_retry_after(header: str | None, seconds: float | None) -> None:
    assert retry_after(header) == seconds


async def test_model_requests_go_through_the_environments_proxy_unless_no_proxy_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    async def forward_proxy(scope: Any, receive: Any, send: Any) -> None:
        """Answers every request itself, as a proxy would after forwarding it; records its target."""
        if scope["type"] != "http":
            return
        seen.append(scope["raw_path"].decode())
        body = b'{"choices": [{"message": {"role": "assistant", "content": "via proxy"}}]}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    request = GenerateInput(
        model=ModelConfig(base_url="http://model.invalid/v1"),
        messages=[Message(role="user", content="hi")],
        rollout_id="r",
        turn=0,
    )
    async with AppServer(forward_proxy) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/v1"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        activities = ModelActivities(default_base_url=None)
        try:
            result = await ActivityEnvironment().run(activities.generate, request)
        finally:
            await activities.aclose()
        assert result.message.content == "via proxy"
        assert seen == ["http://model.invalid/v1/chat/completions"]  # the absolute form a proxy gets
        monkeypatch.setenv("NO_PROXY", "model.invalid")
        activities = ModelActivities(default_base_url=None)
        try:
            with pytest.raises(ApplicationError, match=r"model\.invalid") as failed:
                await ActivityEnvironment().run(activities.generate, request)
        finally:
            await activities.aclose()
        assert failed.value.type == MODEL_ERROR and len(seen) == 1  # direct, and nothing resolves .invalid
