"""Contract messages <-> the OpenAI chat-completions wire format, in two tool formats.

Pure functions, no I/O: `gymflow.activities.model` uses them to talk to a model endpoint, and
`gymflow.workers.servers.policy` uses the inverse direction to put a `Policy` behind the same wire.

Tool formats:

* ``native``: tools travel as ``tools=[...]``, calls as ``tool_calls`` with JSON-string
  arguments, observations as ``role="tool"`` messages. What vLLM (with a tool parser), SGLang and
  OpenAI speak.
* ``hermes``: no ``tools`` parameter. The tool list is rendered into the system prompt exactly as
  the Qwen2.5/Hermes chat templates do it (a ``# Tools`` section, one JSON schema per line inside
  ``<tools></tools>``), the model writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  in its text, and observations go back as one user message of ``<tool_response>`` blocks per run
  of consecutive tool messages. Works with any server that only does plain chat.

Decisions worth knowing:

* A hermes assistant message keeps its content verbatim, ``<tool_call>`` blocks included, and also
  carries the parsed `ToolCall`s. The transcript then holds exactly what the model wrote (what a
  trainer tokenises, and what the model sees next turn); rendering uses the content as is and only
  appends rendered calls when the content has none (a message built by a policy or by hand).
* Parsing never raises and never drops a call: a malformed call becomes a `ToolCall` with
  ``parse_error`` set, so the model can be told what it got wrong. Arguments given as a JSON string
  that itself holds a JSON object (double encoding, common with small models) are accepted.
* In request history, a malformed native call's arguments are sent as JSON even when the model's
  text was not (vLLM ``json.loads`` the arguments of past calls and would reject the whole request);
  text that does not parse goes as a JSON string, which the Qwen/Hermes templates print verbatim.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gymflow.envs.errors import ChatFormatError
from gymflow.envs.wire.models import Message, ToolCall, ToolSpec

ToolFormat = Literal["native", "hermes"]

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
# A closed block, or an unclosed one running to the end (generation cut by max_tokens).
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)
# "<tools>\n": the instruction text itself mentions "<tools></tools>".
_TOOLS_BLOCK_RE = re.compile(r"<tools>\n(.*?)</tools>", re.DOTALL)
# The whole rendered section, so the policy server can hand a policy the original system prompt.
# ("<tool_call>\n": the instructions also mention "<tool_call></tool_call>" before the example.)
_TOOLS_SECTION_RE = re.compile(
    r"(?:\n\n)?# Tools\n.*?<tools>\n.*?</tools>(?:.*?<tool_call>\n.*?</tool_call>)?", re.DOTALL
)
_TOOL_RESPONSE_RE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]*)"')
# json.loads raises RecursionError, not ValueError, on deeply nested input ("[[[[...").
_JSON_ERRORS = (ValueError, RecursionError)


@dataclass(frozen=True)
class ChatRequest:
    """A wire request read back into contract types (the policy server's view)."""

    messages: list[Message]
    tools: list[ToolSpec]
    tool_format: ToolFormat


# -- contract -> wire (requests to a model) ----------------------------------------------------


def render_tools_block(tools: Sequence[ToolSpec]) -> str:
    """The hermes ``# Tools`` section for a system prompt, one compact JSON schema per line."""
    lines = "\n".join(json.dumps(tool.to_openai(), ensure_ascii=False) for tool in tools)
    return _TOOLS_HEADER + lines + _TOOLS_FOOTER


def render_tools(tools: Sequence[ToolSpec], tool_format: ToolFormat) -> list[dict[str, Any]] | None:
    """The request's ``tools`` parameter: the OpenAI tool list, or None (omit it).

    None for hermes (the tools live in the system prompt) and for an empty list (OpenAI rejects
    ``tools: []``).
    """
    if tool_format == "hermes" or not tools:
        return None
    return [tool.to_openai() for tool in tools]


def render_messages(
    messages: Sequence[Message], tools: Sequence[ToolSpec], tool_format: ToolFormat
) -> list[dict[str, Any]]:
    """Contract messages as the ``messages`` of a chat-completions request (text only: tool images
    go to models that take them through gymflow.envs.wire.images).

    Args:
        messages: The conversation, system prompt first when there is one.
        tools: The tools offered; for hermes they are rendered into the system prompt.
        tool_format: ``"native"`` or ``"hermes"``.

    Returns:
        JSON-ready wire messages.
    """
    if tool_format == "native":
        return [_native_message(message) for message in messages]
    wire: list[dict[str, Any]] = []
    in_tool_run = False  # consecutive tool messages share one user message
    for message in messages:
        if message.role == "tool":
            block = f"<tool_response>\n{message.content}\n</tool_response>"
            if in_tool_run:
                wire[-1]["content"] += "\n" + block
            else:
                wire.append({"role": "user", "content": block})
        elif message.role == "assistant":
            wire.append({"role": "assistant", "content": hermes_content(message)})
        else:
            wire.append({"role": message.role, "content": message.content})
        in_tool_run = message.role == "tool"
    if tools:
        block = render_tools_block(tools)
        if wire and wire[0]["role"] == "system":
            system = wire[0]["content"]
            wire[0]["content"] = f"{system}\n\n{block}" if system else block
        else:
            wire.insert(0, {"role": "system", "content": block})
    return wire


def _native_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        calls = [_native_call(call, _history_arguments(call)) for call in message.tool_calls]
        return {"role": "assistant", "content": message.content or None, "tool_calls": calls}
    return {"role": message.role, "content": message.content}


def _native_call(call: ToolCall, arguments: str) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _history_arguments(call: ToolCall) -> str:
    """A past call's arguments as valid JSON text (see the module docstring)."""
    raw = call.raw_arguments
    if raw is None or not raw.strip():
        return _dump(call.arguments)
    try:
        json.loads(raw)
    except _JSON_ERRORS:
        return _dump(raw)
    return raw


def hermes_content(message: Message) -> str:
    """An assistant message's hermes text: its content, plus its calls if the text has none."""
    if not message.tool_calls or "<tool_call>" in message.content:
        return message.content
    blocks = "\n".join(render_hermes_call(call) for call in message.tool_calls)
    return f"{message.content}\n{blocks}" if message.content else blocks


def render_hermes_call(call: ToolCall) -> str:
    """One ``<tool_call>`` block; ``raw_arguments``, when set, goes in verbatim."""
    name = json.dumps(call.name, ensure_ascii=False)
    raw = call.raw_arguments
    arguments = raw if raw is not None and raw.strip() else _dump(call.arguments)
    return f'<tool_call>\n{{"name": {name}, "arguments": {arguments}}}\n</tool_call>'


# -- wire -> contract (a model's completion) ---------------------------------------------------


def parse_assistant_message(wire: Mapping[str, Any], tool_format: ToolFormat, *, id_prefix: str = "call") -> Message:
    """A completion's ``choices[i].message`` as an assistant Message. Never raises.

    Args:
        wire: The wire message (``content``, ``tool_calls``).
        tool_format: How the model writes tool calls.
        id_prefix: Prefix for generated call ids (``f"{id_prefix}_{i}"``); pass something unique
            per turn, e.g. ``f"call_{turn}"``, since hermes calls carry no ids of their own.
    """
    content = content_text(wire.get("content"))
    if tool_format == "hermes":
        calls = parse_hermes_tool_calls(content, id_prefix=id_prefix)
    else:
        calls = parse_native_tool_calls(wire.get("tool_calls"), id_prefix=id_prefix)
    return Message(role="assistant", content=content, tool_calls=calls)


def content_text(content: Any) -> str:
    """Wire content (a string, None, or a list of content parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return str(content)


def parse_native_tool_calls(raw_calls: Any, *, id_prefix: str = "call") -> list[ToolCall]:
    """OpenAI ``tool_calls`` as ToolCalls; malformed entries are kept with ``parse_error``."""
    if not raw_calls:
        return []
    if not isinstance(raw_calls, list):
        raw_calls = [raw_calls]  # a lone call object from a sloppy server
    calls = []
    for i, raw in enumerate(raw_calls):
        call_id = f"{id_prefix}_{i}"
        if not isinstance(raw, Mapping):
            calls.append(ToolCall(id=call_id, name="", raw_arguments=_dump(raw), parse_error="not an object"))
            continue
        if isinstance(raw.get("id"), str) and raw["id"]:
            call_id = raw["id"]
        function = raw.get("function")
        if not isinstance(function, Mapping):
            function = {}
        calls.append(_make_call(call_id, function.get("name"), function.get("arguments")))
    return calls


def parse_hermes_tool_calls(text: str, *, id_prefix: str = "call") -> list[ToolCall]:
    """The ``<tool_call>`` blocks of a hermes completion, in order. Never raises.

    ``raw_arguments`` is the arguments string when the model double-encoded them, the whole block
    body when the block is not a JSON object (its arguments cannot be isolated), else None.
    """
    calls = []
    for i, match in enumerate(_TOOL_CALL_RE.finditer(text)):
        call_id = f"{id_prefix}_{i}"
        body = (match.group(1) if match.group(1) is not None else match.group(2)).strip()
        try:
            payload = json.loads(body)
        except _JSON_ERRORS as exc:
            name_match = _NAME_RE.search(body)
            name = name_match.group(1) if name_match else ""
            calls.append(ToolCall(id=call_id, name=name, raw_arguments=body, parse_error=f"invalid JSON: {exc}"))
            continue
        if not isinstance(payload, dict):
            calls.append(ToolCall(id=call_id, name="", raw_arguments=body, parse_error="tool call is not an object"))
            continue
        # Some models write "parameters" (Llama style); a call without either has no arguments.
        arguments = payload.get("arguments", payload.get("parameters", {}))
        calls.append(_make_call(call_id, payload.get("name"), arguments))
    return calls


def _make_call(call_id: str, name: Any, arguments: Any) -> ToolCall:
    """Validate one call's name and arguments; any problem goes into ``parse_error``."""
    raw = arguments if isinstance(arguments, str) else None
    value, error = _arguments_object(arguments)
    if error is not None and raw is None:
        raw = _dump(arguments)
    if not isinstance(name, str) or not name:
        error = "missing tool name" if error is None else f"missing tool name; {error}"
        name = name if isinstance(name, str) else ""
    if error is not None:
        return ToolCall(id=call_id, name=name, raw_arguments=raw, parse_error=error)
    return ToolCall(id=call_id, name=name, arguments=value, raw_arguments=raw)


def _arguments_object(arguments: Any) -> tuple[dict[str, Any], str | None]:
    """Arguments as a dict: an object, JSON object text, or a JSON string holding such text.

    Absent or empty arguments mean ``{}`` (servers send ``""`` for tools without parameters).
    """
    if isinstance(arguments, dict):
        return arguments, None
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, None
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except _JSON_ERRORS as exc:
            return {}, f"arguments are not valid JSON: {exc}"
        if isinstance(value, str):  # double-encoded: a JSON string holding the object's text
            with contextlib.suppress(*_JSON_ERRORS):
                value = json.loads(value)
        if isinstance(value, dict):
            return value, None
    return {}, "arguments must be a JSON object"


def _dump(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


# -- wire -> contract (the policy server reading a request) ------------------------------------


def read_request(wire_messages: Any, wire_tools: Any = None) -> ChatRequest:
    """A chat-completions request's messages and tools as contract types.

    The format is native when the request has a ``tools`` parameter or any native tool message
    or call (a native request with no tools omits ``tools``), hermes otherwise: tools then come
    from the system prompt's ``<tools>`` block, which is removed from the system message the policy
    sees, and user messages made only of ``<tool_response>`` blocks become tool messages.

    Raises:
        ChatFormatError: The request is malformed (names what is wrong).
    """
    if not isinstance(wire_messages, list) or not all(isinstance(m, Mapping) for m in wire_messages):
        raise ChatFormatError("'messages' must be a list of objects")
    native = wire_tools is not None or any(m.get("role") == "tool" or m.get("tool_calls") for m in wire_messages)
    tools = _read_native_tools(wire_tools) if wire_tools is not None else []
    messages: list[Message] = []
    for index, wire in enumerate(wire_messages):
        role = wire.get("role")
        content = content_text(wire.get("content"))
        if role == "system" and not native and not tools and _TOOLS_BLOCK_RE.search(content):
            tools = _read_hermes_tools(content)
            content = _TOOLS_SECTION_RE.sub("", content, count=1).strip()
            if content:
                messages.append(Message(role="system", content=content))
        elif role == "assistant":
            fmt: ToolFormat = "native" if native else "hermes"
            messages.append(parse_assistant_message(wire, fmt, id_prefix=f"call_{index}"))
        elif role == "tool":
            call_id = wire.get("tool_call_id")
            messages.append(Message(role="tool", content=content, tool_call_id=str(call_id or "")))
        elif role == "user" and not native and _only_tool_responses(content):
            messages.extend(Message(role="tool", content=body) for body in _TOOL_RESPONSE_RE.findall(content))
        elif role in ("system", "developer", "user"):
            messages.append(Message(role="user" if role == "user" else "system", content=content))
        else:
            raise ChatFormatError(f"messages[{index}]: unsupported role {role!r}")
    tool_format: ToolFormat = "native" if native else "hermes"
    return ChatRequest(messages=_link_tool_messages(messages), tools=tools, tool_format=tool_format)


def _only_tool_responses(content: str) -> bool:
    return "<tool_response>" in content and not _TOOL_RESPONSE_RE.sub("", content).strip()


def _link_tool_messages(messages: list[Message]) -> list[Message]:
    """Fill each tool message's call id and tool name from the assistant calls it answers."""
    linked: list[Message] = []
    pending: list[ToolCall] = []
    by_id: dict[str, ToolCall] = {}
    for message in messages:
        if message.role == "assistant":
            pending = list(message.tool_calls)
            by_id.update((call.id, call) for call in message.tool_calls)
        call = None
        if message.role == "tool":
            call = by_id.get(message.tool_call_id or "") or (pending[0] if pending else None)
        if call is None:
            linked.append(message)
            continue
        if call in pending:
            pending.remove(call)
        linked.append(message.model_copy(update={"tool_call_id": call.id, "name": call.name}))
    return linked


def _read_native_tools(wire_tools: Any) -> list[ToolSpec]:
    if not isinstance(wire_tools, list):
        raise ChatFormatError("'tools' must be a list")
    return [_tool_spec(entry, f"tools[{i}]") for i, entry in enumerate(wire_tools)]


def _read_hermes_tools(system: str) -> list[ToolSpec]:
    match = _TOOLS_BLOCK_RE.search(system)
    lines = match.group(1).splitlines() if match else []
    tools = []
    for i, line in enumerate(filter(None, (line.strip() for line in lines))):
        try:
            entry = json.loads(line)
        except _JSON_ERRORS as exc:
            raise ChatFormatError(f"<tools> line {i + 1} is not JSON: {exc}") from exc
        tools.append(_tool_spec(entry, f"<tools> line {i + 1}"))
    return tools


def _tool_spec(entry: Any, where: str) -> ToolSpec:
    function = entry.get("function", entry) if isinstance(entry, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ChatFormatError(f"{where}: not a function tool with a name")
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise ChatFormatError(f"{where}: 'parameters' must be an object")
    return ToolSpec(name=function["name"], description=str(function.get("description") or ""), input_schema=schema)


# -- contract -> wire (the policy server's answer) ---------------------------------------------


def assistant_to_wire(message: Message, tool_format: ToolFormat) -> dict[str, Any]:
    """A policy's assistant message as a completion's ``choices[0].message``.

    Native calls send ``raw_arguments`` verbatim when set, so a test policy can emit broken JSON on
    purpose; hermes calls are rendered into the content with `render_hermes_call`.
    """
    if tool_format == "hermes":
        return {"role": "assistant", "content": hermes_content(message)}
    if not message.tool_calls:
        return {"role": "assistant", "content": message.content}
    calls = [
        _native_call(call, call.raw_arguments if call.raw_arguments is not None else _dump(call.arguments))
        for call in message.tool_calls
    ]
    return {"role": "assistant", "content": message.content or None, "tool_calls": calls}
