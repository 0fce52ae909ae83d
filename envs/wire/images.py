"""Tool images for models that take images (`ModelConfig.images`): OpenAI ``image_url`` parts.

OpenAI-compatible servers (OpenAI, vLLM, SGLang) accept image parts in user messages only, not in
``role="tool"`` messages, and a user message may not come between an assistant's tool calls and
their answers. So the images of a run of tool messages follow the run as one user message:
"Images returned by <tool>:" and the image parts, in call order. Only images kept inline (base64
in the tool result) are sent; larger ones stay in the rollout's workspace, named in the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymflow.envs.wire.chat import ToolFormat, render_messages
from gymflow.envs.wire.models import Message, ToolSpec


def render_messages_with_images(
    messages: Sequence[Message], tools: Sequence[ToolSpec], tool_format: ToolFormat
) -> list[dict[str, Any]]:
    """`gymflow.envs.wire.chat.render_messages`, plus the images tools returned (`Message.images`) after each
    run of tool messages, as ``image_url`` parts (``data:`` URLs) of one user message.

    The text of each tool message keeps its placeholders (``[image: image/png, 12 KB]``), so the
    model can tell which call returned which image.
    """
    if not any(m.images for m in messages):
        return render_messages(messages, tools, tool_format)
    # A placeholder user message after each run of tool messages that has images, rendered like
    # any user message, then swapped for the message of image parts.
    marked: list[Message] = []
    runs: dict[str, list[Message]] = {}
    for index, message in enumerate(messages):
        marked.append(message)
        run_ends = index + 1 == len(messages) or messages[index + 1].role != "tool"
        if message.role == "tool" and run_ends:
            run: list[Message] = []
            for earlier in reversed(messages[: index + 1]):
                if earlier.role != "tool":
                    break
                run.insert(0, earlier)
            if any(m.images for m in run):
                marker = f"\x00gymflow-images-{index}"
                runs[marker] = [m for m in run if m.images]
                marked.append(Message(role="user", content=marker))
    return [
        _image_message(runs[w["content"]]) if w["role"] == "user" and w.get("content") in runs else w
        for w in render_messages(marked, tools, tool_format)
    ]


def _image_message(messages: Sequence[Message]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for message in messages:
        parts.append({"type": "text", "text": f"Images returned by {message.name or 'the tool'}:"})
        parts.extend(
            {"type": "image_url", "image_url": {"url": f"data:{image.mime_type};base64,{image.data}"}}
            for image in message.images
        )
    return {"role": "user", "content": parts}
