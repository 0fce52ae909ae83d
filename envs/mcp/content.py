"""Turning an MCP `CallToolResult` into the contract's ToolResult, and per-tool output parsers.

Text blocks are joined into the text the model reads. Binary blocks (images, audio, blob
resources) are never dropped silently: each becomes a `ToolAttachment`, kept inline as base64
while the result's binary total stays under the server's `max_inline_media_bytes`, and otherwise
written into the rollout's workspace under `.media/` (named by content hash, so a replayed call
renders the same text) and referenced by path. The text names every attachment where it appeared
with a short placeholder (`[image: image/png, 12 KB]`): what a model that takes no images reads;
one that does (`ModelConfig.images`) gets the inline images as image parts too (gymflow.envs.wire.chat).

Parsers (config `parsers: {tool: spec}`) run on successful results only; the model must see
errors as they are:

* `json`: the text is parsed into `structured`; text that is not JSON is an error observation
  that quotes it, so a broken server output never passes for data;
* `text`: structured content is dropped (the model reads text only; smaller history);
* `module:function` / `file.py:function`: `fn(result: ToolResult) -> ToolResult | str | Any`,
  sync or async; a str replaces the text, any other value becomes `structured`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import inspect
import json
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import mcp_types

from gymflow.envs.contract import ToolAttachment, ToolResult
from gymflow.envs.plugins import load_callable
from gymflow.envs.runtime import workspace as ws

Parser = Callable[[ToolResult], "ToolResult | str | Any | Awaitable[ToolResult | str | Any]"]
MEDIA_DIR = ".media"
"""Workspace subdirectory for binary content too large to keep inline."""


def render_result(result: mcp_types.CallToolResult, *, workspace: Path | None, max_inline_bytes: int) -> ToolResult:
    """Flatten MCP content blocks into the text the model sees, keeping structured and binary content."""
    parts: list[str] = []
    attachments: list[ToolAttachment] = []
    inline_total = 0
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
            continue
        if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            kind: Literal["image", "audio", "resource"] = block.type
            data, mime, uri = block.data, block.mime_type, None
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
                continue
            kind, data, uri = "resource", resource.blob, str(resource.uri)
            mime = resource.mime_type or "application/octet-stream"
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
            continue
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}]")
            continue
        raw = _decode(data)
        if inline_total + len(raw) <= max_inline_bytes:
            inline_total += len(raw)
            attachments.append(ToolAttachment(kind=kind, mime_type=mime, size_bytes=len(raw), data=data, uri=uri))
            where = ""
        elif workspace is not None:
            name = f"{MEDIA_DIR}/{hashlib.sha256(raw).hexdigest()[:16]}{mimetypes.guess_extension(mime) or '.bin'}"
            ws.write_in(workspace, raw, name)
            attachments.append(
                ToolAttachment(kind=kind, mime_type=mime, size_bytes=len(raw), workspace_path=name, uri=uri)
            )
            where = f", saved to workspace file {name}"
        else:  # no workspace to hold it: say so rather than carry megabytes through history
            attachments.append(ToolAttachment(kind=kind, mime_type=mime, size_bytes=len(raw), uri=uri))
            where = ", omitted: over the inline cap and no workspace"
        parts.append(f"[{kind}: {mime}, {human_size(len(raw))}{where}]")
    return ToolResult(
        text="\n".join(parts),
        is_error=bool(result.is_error),
        structured=result.structured_content,
        attachments=attachments,
    )


def human_size(size: int) -> str:
    """`612 B`, `12 KB`, `3.4 MB`: a size as a placeholder names it."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{round(size / 1024)} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def load_parser(spec: str, *, base_dir: Path | None = None, field: str = "parsers") -> Parser:
    """The parser a config spec names (`json`, `text`, `module:function` or `file.py:function`)."""
    if spec == "json":
        return _parse_json
    if spec == "text":
        return _text_only
    return load_callable(spec, base_dir=base_dir, field=field)


async def apply_parser(parser: Parser, result: ToolResult) -> ToolResult:
    """Run `parser` on a successful result; errors pass through untouched."""
    if result.is_error:
        return result
    value = parser(result)
    if inspect.isawaitable(value):
        value = await value
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return result.model_copy(update={"text": value})
    return result.model_copy(update={"structured": value})


def _parse_json(result: ToolResult) -> ToolResult:
    try:
        value = json.loads(result.text)
    except json.JSONDecodeError as exc:
        return ToolResult(text=f"{result.text}\n[tool output is not valid JSON: {exc.msg}]", is_error=True)
    return result.model_copy(update={"structured": value})


def _text_only(result: ToolResult) -> ToolResult:
    return result.model_copy(update={"structured": None})


def _decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return data.encode()  # not base64 after all: keep the bytes we were given
