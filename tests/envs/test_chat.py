"""gymflow.envs.wire.chat: both directions of the wire, both tool formats, and malformed tool calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.errors import ChatFormatError
from gymflow.envs.wire import chat

ADD = ToolSpec(
    name="add",
    description="Add two numbers.",
    input_schema={"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
)
ECHO = ToolSpec(name="echo", description="Echo text.")


def _conversation() -> list[Message]:
    return [
        Message(role="system", content="You are careful."),
        Message(role="user", content="What is 2 + 3, and say hi?"),
        Message(
            role="assistant",
            content="Let me compute.",
            tool_calls=[
                ToolCall(id="c0", name="add", arguments={"a": 2, "b": 3}),
                ToolCall(id="c1", name="echo", arguments={"text": "hi"}),
            ],
        ),
        Message(role="tool", content="5", tool_call_id="c0", name="add"),
        Message(role="tool", content="hi", tool_call_id="c1", name="echo"),
        Message(role="assistant", content="5, and hi."),
    ]


def test_native_render() -> None:
    wire = chat.render_messages(_conversation(), [ADD, ECHO], "native")
    assert wire[0] == {"role": "system", "content": "You are careful."}
    assert wire[2]["tool_calls"][0] == {
        "id": "c0",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
    }
    assert wire[3] == {"role": "tool", "tool_call_id": "c0", "content": "5"}
    assert chat.render_tools([ADD], "native") == [ADD.to_openai()]
    assert chat.render_tools([], "native") is None
    assert chat.render_tools([ADD], "hermes") is None


def test_hermes_render() -> None:
    wire = chat.render_messages(_conversation(), [ADD, ECHO], "hermes")
    system = wire[0]["content"]
    assert system.startswith("You are careful.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(ADD.to_openai())}\n{json.dumps(ECHO.to_openai())}\n</tools>" in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system
    assert "tool_calls" not in wire[2]
    assert wire[2]["content"] == (
        "Let me compute.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call>'
    )
    # Consecutive observations become one user message.
    assert wire[3] == {
        "role": "user",
        "content": "<tool_response>\n5\n</tool_response>\n<tool_response>\nhi\n</tool_response>",
    }
    assert len(wire) == 5


def test_hermes_render_without_system_prompt() -> None:
    wire = chat.render_messages([Message(role="user", content="hi")], [ADD], "hermes")
    assert wire[0] == {"role": "system", "content": chat.render_tools_block([ADD])}
    assert chat.render_messages([Message(role="user", content="hi")], [], "hermes") == [
        {"role": "user", "content": "hi"}
    ]


def test_hermes_content_is_verbatim_when_it_has_calls() -> None:
    text = 'ok <tool_call>{"name":"add","arguments":{"a":1}}</tool_call>'
    parsed = chat.parse_assistant_message({"content": text}, "hermes", id_prefix="call_3")
    assert parsed.content == text
    assert parsed.tool_calls == [ToolCall(id="call_3_0", name="add", arguments={"a": 1})]
    assert chat.render_messages([parsed], [], "hermes") == [{"role": "assistant", "content": text}]


@pytest.mark.parametrize("tool_format", ["native", "hermes"])
def test_request_round_trip(tool_format: chat.ToolFormat) -> None:
    conversation = _conversation()
    wire = chat.render_messages(conversation, [ADD, ECHO], tool_format)
    request = chat.read_request(json.loads(json.dumps(wire)), chat.render_tools([ADD, ECHO], tool_format))
    assert request.tool_format == tool_format
    assert request.tools == [ADD, ECHO]
    assert [m.role for m in request.messages] == [m.role for m in conversation]
    assert request.messages[0].content == "You are careful."  # hermes tools block removed
    calls = request.messages[2].tool_calls
    assert [(c.name, c.arguments, c.parse_error) for c in calls] == [
        ("add", {"a": 2, "b": 3}, None),
        ("echo", {"text": "hi"}, None),
    ]
    tool_messages = request.messages[3:5]
    assert [(m.content, m.tool_call_id, m.name) for m in tool_messages] == [
        ("5", calls[0].id, "add"),
        ("hi", calls[1].id, "echo"),
    ]


@pytest.mark.parametrize("tool_format", ["native", "hermes"])
def test_assistant_round_trip(tool_format: chat.ToolFormat) -> None:
    reply = Message(role="assistant", content="", tool_calls=[ToolCall(id="x", name="add", arguments={"a": 1, "b": 2})])
    wire = chat.assistant_to_wire(reply, tool_format)
    parsed = chat.parse_assistant_message(json.loads(json.dumps(wire)), tool_format, id_prefix="call_0")
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", {"a": 1, "b": 2})]
    final = chat.assistant_to_wire(Message(role="assistant", content="42"), tool_format)
    assert final["content"] == "42"
    assert "tool_calls" not in final


def test_raw_arguments_are_sent_verbatim() -> None:
    broken = ToolCall(id="b", name="add", raw_arguments='{"a": 1,', parse_error="on purpose")
    native = chat.assistant_to_wire(Message(role="assistant", tool_calls=[broken]), "native")
    assert native["tool_calls"][0]["function"]["arguments"] == '{"a": 1,'
    hermes = chat.assistant_to_wire(Message(role="assistant", tool_calls=[broken]), "hermes")
    assert hermes["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 1,}\n</tool_call>'
    # In request history the broken text goes as a JSON string, which servers can parse.
    history = chat.render_messages([Message(role="assistant", tool_calls=[broken])], [], "native")
    assert json.loads(history[0]["tool_calls"][0]["function"]["arguments"]) == '{"a": 1,'


@pytest.mark.parametrize(
    ("arguments", "expected", "error"),
    [
        ('{"a": 1}', {"a": 1}, None),
        ("", {}, None),
        ({"a": 1}, {"a": 1}, None),
        (json.dumps('{"a": 1}'), {"a": 1}, None),  # double-encoded: accepted
        ('{"a": 1', {}, "not valid JSON"),
        ("[1, 2]", {}, "must be a JSON object"),
        ('"just text"', {}, "must be a JSON object"),
        (7, {}, "must be a JSON object"),
    ],
)
def test_native_arguments(arguments: object, expected: dict[str, object], error: str | None) -> None:
    raw = [{"id": "call_a", "type": "function", "function": {"name": "add", "arguments": arguments}}]
    [call] = chat.parse_native_tool_calls(raw)
    assert call.id == "call_a"
    assert call.name == "add"
    assert call.arguments == expected
    if error is None:
        assert call.parse_error is None
    else:
        assert call.parse_error is not None
        assert error in call.parse_error
        assert call.raw_arguments is not None


def test_native_malformed_entries_are_kept() -> None:
    calls = chat.parse_native_tool_calls(
        ["nonsense", {"function": {"arguments": "{}"}}, {"id": "", "function": "x"}], id_prefix="call_2"
    )
    assert [c.id for c in calls] == ["call_2_0", "call_2_1", "call_2_2"]
    assert all(c.parse_error for c in calls)
    assert "missing tool name" in (calls[1].parse_error or "")
    assert chat.parse_native_tool_calls(None) == []


def test_hermes_malformed_calls_are_kept() -> None:
    text = (
        'Thinking.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {a: 1}}</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}</tool_call>'
        '<tool_call>["add"]</tool_call>'
        '<tool_call>{"name": "echo", "arguments": {"text": "cut'
    )
    calls = chat.parse_hermes_tool_calls(text, id_prefix="call_1")
    assert [c.id for c in calls] == [f"call_1_{i}" for i in range(7)]
    assert [c.name for c in calls] == ["add", "add", "", "add", "echo", "", "echo"]
    assert calls[0].parse_error is None
    assert calls[0].arguments == {"a": 1}
    assert "invalid JSON" in (calls[1].parse_error or "")
    assert calls[1].raw_arguments == '{"name": "add", "arguments": {a: 1}}'
    assert calls[2].parse_error == "missing tool name"
    assert calls[3].parse_error == "arguments must be a JSON object"
    assert calls[4].parse_error is None  # double-encoded arguments accepted
    assert calls[4].arguments == {"text": "hi"}
    assert calls[5].parse_error == "tool call is not an object"
    assert "invalid JSON" in (calls[6].parse_error or "")  # unclosed, cut by max_tokens


def test_read_request_hermes_without_tools() -> None:
    request = chat.read_request([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert request.tool_format == "hermes"
    assert request.tools == []
    assert request.messages == [Message(role="user", content="hi")]


@pytest.mark.parametrize(
    ("messages", "tools"),
    [
        (None, None),
        ([1], None),
        ([{"role": "wizard", "content": "x"}], None),
        ([{"role": "user", "content": "x"}], {"not": "a list"}),
        ([{"role": "user", "content": "x"}], [{"type": "function", "function": {}}]),
        ([{"role": "system", "content": "<tools>\nnot json\n</tools>"}], None),
    ],
)
def test_read_request_rejects_malformed(messages: object, tools: object) -> None:
    with pytest.raises(ChatFormatError):
        chat.read_request(messages, tools)


def test_deeply_nested_json_is_a_parse_error() -> None:
    [call] = chat.parse_hermes_tool_calls("<tool_call>" + "[" * 100_000 + "</tool_call>")
    assert call.parse_error
    [call] = chat.parse_native_tool_calls([{"function": {"name": "f", "arguments": "[" * 100_000}}])
    assert call.parse_error


@given(st.text())
def test_hermes_parser_never_raises(text: str) -> None:
    for call in chat.parse_hermes_tool_calls(text):
        assert call.parse_error is not None or isinstance(call.arguments, dict)


@given(st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"name"', ":", '"add"', ",", "[", "x"])))
def test_hermes_parser_never_raises_on_near_misses(tokens: list[str]) -> None:
    text = "".join(tokens)
    calls = chat.parse_hermes_tool_calls(text)
    assert len(calls) <= text.count("<tool_call>")
    assert all(call.parse_error is not None or call.name == "add" for call in calls)
