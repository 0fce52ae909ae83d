"""The OpenAI Responses API in terms of chat completions, for the model gateway.

`to_chat` turns a Responses request into the chat request it means, `from_chat` a chat completion
into a Response object, and `events` a Response into the server-sent events of a streamed answer
(``response.created`` ... ``response.completed``).

Mapping:

* ``instructions`` -> the first, system message; ``developer`` messages -> system messages;
* ``input``: a string is one user message; items are messages (``input_text`` / ``output_text``
  parts), ``function_call`` items (-> the assistant's ``tool_calls``, consecutive ones in one
  message) and ``function_call_output`` items (-> ``tool`` messages); ``reasoning`` items are not
  sent back;
* ``previous_response_id``: the gateway keeps, per program, each Response's whole conversation and
  passes it here as `previous` (a restarted program starts its chain again, so nothing of it needs
  to outlive the program);
* ``tools`` (flat function tools) -> chat function tools; ``max_output_tokens`` -> ``max_tokens``.

Ids are derived from the recorded completion (``resp_``/``msg_`` + its id, ``fc_`` + the call id),
so an answer replayed from a rollout's record is the same answer, ids included.

Pure (no I/O).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from gymflow.envs.wire.chat import ChatFormatError
from gymflow.envs.wire.streams import TRANSPORT_FIELDS

_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}
_DROPPED = frozenset(
    {"input", "instructions", "previous_response_id", "store", "tools", "tool_choice", "text", "reasoning",
     "include", "truncation", "metadata", "background", "prompt_cache_key", "service_tier", "user",
     "max_tool_calls", "conversation", "prompt", "safety_identifier", "top_logprobs", "stream_options",
     "parallel_tool_calls", *_SAMPLING}
)  # fmt: skip


def to_chat(body: Any, previous: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The chat-completions request a Responses request means (without its transport fields).

    Args:
        body: The request.
        previous: The whole conversation of the response `previous_response_id` names (chat messages).

    Raises:
        ChatFormatError: Naming the field at fault.
    """
    if not isinstance(body, dict):
        raise ChatFormatError("the request body must be a JSON object")
    raw = body.get("input")
    items: list[Any]
    if isinstance(raw, str):
        items = [{"role": "user", "content": raw}]
    elif isinstance(raw, list):
        items = raw
    else:
        raise ChatFormatError("input: must be a string or an array of input items")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    messages += [m for m in previous or [] if m.get("role") != "system" or not messages]
    for index, item in enumerate(items):
        _add_item(messages, item, f"input[{index}]")
    if not messages:
        raise ChatFormatError("input: no messages")
    out: dict[str, Any] = {"model": body.get("model", ""), "messages": messages}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise ChatFormatError("tools: must be an array")
        out["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(body.get("parallel_tool_calls"), bool):
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    for key, name in _SAMPLING.items():
        if body.get(key) is not None:
            out[name] = body[key]
    out.update((k, v) for k, v in body.items() if k not in _DROPPED and k not in TRANSPORT_FIELDS and k not in out)
    return out


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ChatFormatError(f"{where}: must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ChatFormatError(f"{where}.role: must be user, assistant, system or developer")
        messages.append(
            {"role": "system" if role == "developer" else role, "content": _content(item.get("content"), where)}
        )
    elif kind == "function_call":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
            raise ChatFormatError(f"{where}: a function_call needs call_id and name")
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": str(item.get("arguments", ""))},
        }
        last = messages[-1] if messages else None
        if last is not None and last.get("role") == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise ChatFormatError(f"{where}.call_id: required")
        output = item.get("output", "")
        text = output if isinstance(output, str) else _content(output, where)
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    elif kind == "reasoning":
        return
    else:
        raise ChatFormatError(f"{where}.type: {kind!r} is not an input item the gateway reads")


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatFormatError(f"{where}.content: must be a string or an array of parts")
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            raise ChatFormatError(f"{where}.content[{index}]: only text parts are read")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise ChatFormatError(f"{where}: only function tools ({{type: function, name, parameters}}) are supported")
    parameters = tool.get("parameters") or {"type": "object", "properties": {}}
    function = {"name": tool["name"], "description": str(tool.get("description") or ""), "parameters": parameters}
    return {"type": "function", "function": function}


def from_chat(completion: Mapping[str, Any], request: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """A Response object for a chat completion's first choice."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    base = str(completion.get("id", "")).removeprefix("chatcmpl-")
    output: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        output.append(
            {"type": "message", "id": f"msg_{base}", "status": "completed", "role": "assistant", "content": [part]}
        )
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        call_id = str(call.get("id", ""))
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call_id}",
                "call_id": call_id,
                "name": str(function.get("name", "")),
                "arguments": str(function.get("arguments", "")),
                "status": "completed",
            }
        )
    usage = completion.get("usage") or {}
    prompt, generated = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    cut = choice.get("finish_reason") == "length"
    return {
        "id": f"resp_{base}",
        "object": "response",
        "created_at": completion.get("created", 0),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        },
    }


def conversation(chat_request: Mapping[str, Any], completion: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The whole conversation after an answer (request messages + the assistant's), for `previous`."""
    choice = (completion.get("choices") or [{}])[0]
    message = dict(choice.get("message") or {})
    reply = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        reply["tool_calls"] = message["tool_calls"]
    return [*chat_request.get("messages", []), reply]


def events(response: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of the stream that delivers `response`, with sequence numbers."""
    sequence = 0

    def event(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        nonlocal sequence
        sequence += 1
        return kind, {"type": kind, "sequence_number": sequence - 1, **data}

    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(response.get("output") or []):
        if item.get("type") == "message":
            yield event(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}
            )
            for part_index, part in enumerate(item.get("content") or []):
                place = {"item_id": item["id"], "output_index": index, "content_index": part_index}
                yield event("response.content_part.added", **place, part={**part, "text": ""})
                yield event("response.output_text.delta", **place, delta=part.get("text", ""), logprobs=[])
                yield event("response.output_text.done", **place, text=part.get("text", ""), logprobs=[])
                yield event("response.content_part.done", **place, part=part)
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            place = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **place, delta=item.get("arguments", ""))
            yield event("response.function_call_arguments.done", **place, arguments=item.get("arguments", ""))
        yield event("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    yield event(final, response=response)


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape (chat completions and Responses alike)."""
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(status)
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def text_of(value: Any) -> str:
    """Compact JSON of `value` (for error messages)."""
    return json.dumps(value, ensure_ascii=False)[:200]
