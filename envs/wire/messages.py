"""The Anthropic Messages API in terms of chat completions, for the model gateway.

A program written with the ``anthropic`` client talks Messages; the gateway's upstream (vLLM, SGLang,
any OpenAI-compatible server) talks chat completions. `to_chat` turns a Messages request into the
chat request it means, `from_chat` the chat completion back into a Message, and `events` a Message
into the server-sent events of a streamed answer (``message_start`` ... ``message_stop``).

Mapping:

* ``system`` (a string or text blocks) -> the first, system message;
* ``text`` blocks -> content; ``tool_use`` blocks -> the assistant's ``tool_calls`` (``input`` as
  JSON arguments); ``tool_result`` blocks -> ``tool`` messages, before the user's own text;
  ``thinking`` blocks are not sent back (chat templates drop past reasoning too); ``image`` blocks
  become ``image_url`` parts;
* ``tools`` -> function tools (``input_schema`` is the parameters); ``tool_choice`` auto / any /
  tool / none -> auto / required / the named function / none;
* ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` -> their chat names;
* finish reasons: stop -> ``end_turn``, tool_calls -> ``tool_use``, length -> ``max_tokens``.

Pure (no I/O). Malformed requests raise `ChatFormatError`, which the gateway answers with the
Messages API's own error shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from gymflow.envs.wire.chat import ChatFormatError
from gymflow.envs.wire.streams import TRANSPORT_FIELDS

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "function_call": "tool_use"}
_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "stop_sequences": "stop"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """The Messages API's error shape."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def to_chat(body: Any) -> dict[str, Any]:
    """The chat-completions request a Messages request means (without its transport fields).

    Raises:
        ChatFormatError: Naming the field at fault.
    """
    if not isinstance(body, dict):
        raise ChatFormatError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("messages: must be a non-empty array")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ChatFormatError("max_tokens: must be a positive integer")
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": _text(system, "system")})
    for index, message in enumerate(messages):
        chat += _message(message, f"messages.{index}")
    out: dict[str, Any] = {"model": body.get("model", ""), "messages": chat, "max_tokens": max_tokens}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ChatFormatError("tools: must be an array")
        out["tools"] = [_tool(tool, f"tools.{i}") for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _tool_choice(choice)
    for key, name in _SAMPLING.items():
        if body.get(key) is not None:
            out[name] = body[key]
    return {k: v for k, v in out.items() if k not in TRANSPORT_FIELDS}


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in value):
        return "".join(str(b.get("text", "")) for b in value)
    raise ChatFormatError(f"{where}: must be a string or an array of text blocks")


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise ChatFormatError(f"{where}.role: must be 'user' or 'assistant'")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ChatFormatError(f"{where}.content: must be a string or an array of content blocks")
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}.content.{index}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image" and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at)}})
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise ChatFormatError(f"{at}: a tool_use block needs an id and a name")
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise ChatFormatError(f"{at}.tool_use_id: required")
            result = block.get("content", "")
            text = result if isinstance(result, str) else _result_text(result, at)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise ChatFormatError(f"{at}.type: {kind!r} is not a {role} content block the gateway reads")
    out: list[dict[str, Any]] = list(results)
    if role == "assistant":
        text = "".join(p["text"] for p in parts)
        if text or calls:
            out.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
    elif parts:
        plain = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "".join(p["text"] for p in parts) if plain else parts})
    return out


def _result_text(blocks: Any, where: str) -> str:
    if not isinstance(blocks, list):
        raise ChatFormatError(f"{where}.content: must be a string or an array of blocks")
    return "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text")


def _image_url(block: dict[str, Any], where: str) -> str:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    if isinstance(source, dict) and source.get("type") == "url":
        return str(source.get("url", ""))
    raise ChatFormatError(f"{where}.source: a base64 or url image source")


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise ChatFormatError(f"{where}.name: required")
    schema = tool.get("input_schema", {"type": "object", "properties": {}})
    if not isinstance(schema, dict):
        raise ChatFormatError(f"{where}.input_schema: must be a JSON schema object")
    function = {"name": tool["name"], "description": str(tool.get("description", "")), "parameters": schema}
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if mapped is None:
        raise ChatFormatError("tool_choice: must be auto, any, none or {type: tool, name}")
    return mapped


def from_chat(completion: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """A Message (the Messages API's answer) for a chat completion's first choice."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id", "")),
                "name": str(function.get("name", "")),
                "input": _arguments(function.get("arguments")),
            }
        )
    usage = completion.get("usage") or {}
    finish = str(choice.get("finish_reason") or "stop")
    return {
        "id": "msg_" + str(completion.get("id", "")).removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if message.get("tool_calls") else STOP_REASONS.get(finish, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
    }


def _arguments(text: Any) -> dict[str, Any]:
    """Tool arguments as an object; text that is not one is kept whole under ``arguments``."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": text}


def events(message: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of the stream that delivers `message`."""
    usage = message.get("usage") or {}
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message.get("content") or []):
        if block.get("type") == "tool_use":
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input", {}), ensure_ascii=False)}
        else:
            opening = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block.get("text", "")}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stop = {"stop_reason": message.get("stop_reason"), "stop_sequence": None}
    yield (
        "message_delta",
        {"type": "message_delta", "delta": stop, "usage": {"output_tokens": usage.get("output_tokens", 0)}},
    )
    yield "message_stop", {"type": "message_stop"}
