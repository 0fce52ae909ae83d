"""gymflow.workers.servers.policy: a Policy behind a real OpenAI-compatible HTTP endpoint."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest

from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.envs.wire import chat
from gymflow.workers.servers.policy import PolicyServer

ADD = ToolSpec(name="add", description="Add.", input_schema={"type": "object", "properties": {"a": {}, "b": {}}})


class AddThenAnswer(Policy):
    """Calls add(2, 3) on a user turn, answers with the tool's output after it; records what it saw."""

    name = "add-then-answer"

    def __init__(self) -> None:
        self.seen: list[tuple[list[Message], list[ToolSpec]]] = []

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        self.seen.append((list(messages), list(tools)))
        if messages[-1].role == "tool":
            return Message(role="assistant", content=f"The answer is {messages[-1].content}.")
        return Message(role="assistant", tool_calls=[ToolCall(id="p0", name="add", arguments={"a": 2, "b": 3})])


@pytest.fixture(scope="module")
def policy() -> AddThenAnswer:
    return AddThenAnswer()


@pytest.fixture(scope="module")
async def server(policy: AddThenAnswer) -> AsyncIterator[PolicyServer]:
    async with PolicyServer(policy, max_context_tokens=200) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def test_models(server: PolicyServer, http: httpx.AsyncClient) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}/v1"
    response = await http.get(f"{server.url}/models")
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == "add-then-answer"


async def test_native_completion(server: PolicyServer, http: httpx.AsyncClient, policy: AddThenAnswer) -> None:
    messages = [Message(role="system", content="Be brief."), Message(role="user", content="2+3?")]
    body = {"model": "m", "messages": chat.render_messages(messages, [ADD], "native"), "tools": [ADD.to_openai()]}
    response = await http.post(f"{server.url}/chat/completions", json=body)
    assert response.status_code == 200
    completion = response.json()
    assert completion["object"] == "chat.completion"
    assert completion["model"] == "m"
    [choice] = completion["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": "p0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    seen_messages, seen_tools = policy.seen[-1]
    assert seen_messages == messages
    assert seen_tools == [ADD]
    usage = completion["usage"]
    assert usage["prompt_tokens"] == math.ceil((len("Be brief.") + len("2+3?") + len(json.dumps(ADD.to_openai()))) / 4)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_hermes_completion(server: PolicyServer, http: httpx.AsyncClient, policy: AddThenAnswer) -> None:
    call = ToolCall(id="call_1_0", name="add", arguments={"a": 2, "b": 3})
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="2+3?"),
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", content="5", tool_call_id="call_1_0"),
    ]
    body = {"messages": chat.render_messages(messages, [ADD], "hermes")}
    response = await http.post(f"{server.url}/chat/completions", json=body)
    assert response.status_code == 200
    [choice] = response.json()["choices"]
    assert choice["message"] == {"role": "assistant", "content": "The answer is 5."}
    assert choice["finish_reason"] == "stop"
    seen_messages, seen_tools = policy.seen[-1]
    assert seen_tools == [ADD]
    assert seen_messages[0] == Message(role="system", content="Be brief.")  # tools block stripped
    assert [(c.name, c.arguments) for c in seen_messages[2].tool_calls] == [("add", {"a": 2, "b": 3})]
    assert seen_messages[3].role == "tool"
    assert seen_messages[3].name == "add"
    assert seen_messages[3].tool_call_id == seen_messages[2].tool_calls[0].id

    first = await http.post(f"{server.url}/chat/completions", json={"messages": body["messages"][:2]})
    content = first.json()["choices"][0]["message"]["content"]
    assert chat.parse_hermes_tool_calls(content)[0].arguments == {"a": 2, "b": 3}


@pytest.mark.parametrize(
    "payload",
    [
        b"{not json",
        b"[1, 2]",
        b'{"model": "m"}',
        b'{"messages": [{"role": "wizard", "content": "x"}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
        b'{"messages": [{"role": "user", "content": "x"}], "stream": true}',
    ],
)
async def test_malformed_request_is_400(server: PolicyServer, http: httpx.AsyncClient, payload: bytes) -> None:
    response = await http.post(
        f"{server.url}/chat/completions", content=payload, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]


async def test_context_length(server: PolicyServer, http: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": "x" * 801}]}  # 201 estimated tokens > 200
    response = await http.post(f"{server.url}/chat/completions", json=body)
    assert response.status_code == 400
    assert "maximum context length is 200 tokens" in response.json()["error"]["message"]
    body = {"messages": [{"role": "user", "content": "x" * 800}]}
    assert (await http.post(f"{server.url}/chat/completions", json=body)).status_code == 200


async def test_port_zero_and_stop(policy: AddThenAnswer, http: httpx.AsyncClient) -> None:
    async with PolicyServer(policy) as first, PolicyServer(policy) as second:
        assert first.port != second.port
        assert (await http.get(f"{second.url}/models")).status_code == 200
        url = first.url
    with pytest.raises(httpx.ConnectError):
        await http.get(f"{url}/models")
    with pytest.raises(RuntimeError):
        _ = first.url
