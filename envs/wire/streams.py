"""Chat-completions requests as an agent program sends them, and answers streamed back in SSE.

The model gateway (gymflow.workers.servers.gateway) asks its upstream for whole completions: a model
turn is one durable activity, and its answer is recorded before the program sees any of it. A
program that asked for a stream gets that answer replayed as the server-sent events its client
parses (`chat_chunks`): the role, the text, each tool call's name and arguments, the finish reason,
and with ``stream_options.include_usage`` the usage chunk, then ``[DONE]``. The program therefore
sees every token at once, after the turn, instead of as it is generated.

`program_request` checks and normalises a program's request: the fields that only shape the
transport (``stream``, ``stream_options``) are dropped, so a streamed and a plain request for the
same conversation are the same request (and answered alike when a restarted program asks again).

Pure (no I/O).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from gymflow.envs.wire.chat import ChatFormatError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
TRANSPORT_FIELDS = frozenset({"stream", "stream_options"})
"""Request fields that change how an answer travels, not what it is."""


def program_request(body: Any) -> dict[str, Any]:
    """A program's chat-completions request, checked, without its transport fields.

    Raises:
        ChatFormatError: Not a JSON object, no ``messages`` list of role-tagged objects, or ``n`` > 1
            (one completion per model turn).
    """
    if not isinstance(body, dict):
        raise ChatFormatError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("'messages' must be a non-empty array of messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ChatFormatError(f"messages[{index}] must be an object with a role among {sorted(ROLES)}")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise ChatFormatError(f"messages[{index}].content must be a string or an array of parts")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ChatFormatError("'tools' must be an array")
    n = body.get("n")
    if n is not None and n != 1:
        raise ChatFormatError("'n' must be 1: the gateway answers one completion per model turn")
    return {key: value for key, value in body.items() if key not in TRANSPORT_FIELDS}


def wants_stream(body: Mapping[str, Any]) -> bool:
    return body.get("stream") is True


def include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def chat_chunks(completion: Mapping[str, Any], *, usage: bool) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects that stream `completion` (its first choice)."""
    head = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    for key in ("reasoning_content", "content"):
        text = message.get(key)
        if isinstance(text, str) and text:
            yield chunk({key: text})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.get("id", ""),
                        "type": "function",
                        "function": {"name": function.get("name", ""), "arguments": function.get("arguments", "")},
                    }
                ]
            }
        )
    yield chunk({}, str(choice.get("finish_reason") or "stop"))
    if usage:
        yield {**head, "choices": [], "usage": completion.get("usage")}


def sse(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: ``event:`` (when named) and ``data:`` lines, then a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


def chat_stream(completion: Mapping[str, Any], *, usage: bool) -> bytes:
    """The whole SSE body streaming `completion`, ``data: [DONE]`` last."""
    return b"".join(sse(chunk) for chunk in chat_chunks(completion, usage=usage)) + sse("[DONE]")
