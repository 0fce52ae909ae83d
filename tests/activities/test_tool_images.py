"""An image an MCP tool returns reaches a model that takes images as an OpenAI `image_url` part, and
one that does not as a short text placeholder: checked in the requests a real HTTP endpoint got."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Message as AsgiMessage
from starlette.types import Receive, Scope, Send
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.contract import Message, Task, TerminationReason, ToolAttachment
from gymflow.envs.policy import Policy
from gymflow.envs.wire import chat
from gymflow.envs.wire.images import render_messages_with_images
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import AppServer, build_app
from gymflow.workers.worker import running_worker
from support import ScriptedPolicy, call, make_settings

SIZE = 12 * 1024
"""Bytes of the tool's PNG: "12 KB" in the placeholder, kept inline (under the 256 KiB cap)."""


class Recording:
    """A policy's chat endpoint (ASGI) that keeps the JSON body of every completion request."""

    def __init__(self, policy: Policy) -> None:
        self.app = build_app(policy)
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            event = await receive()
            chunks.append(event.get("body", b""))
            more = event.get("more_body", False)
        body = b"".join(chunks)
        self.bodies.append(json.loads(body))
        replayed = False

        async def again() -> AsgiMessage:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, again, send)


async def _second_request(client: Client, tmp_path: Path, *, images: bool) -> dict[str, Any]:
    script = ScriptedPolicy(
        [Message(role="assistant", tool_calls=[call("image", {"size": SIZE})]), Message(role="assistant", content="0")]
    )
    endpoint = Recording(script)
    async with running_worker(client, make_settings(tmp_path)) as worker, AppServer(endpoint) as server:
        result = await run_rollout(
            client,
            RolloutInput(
                env="counter",
                task=Task(id="img", prompt="look at the picture", ground_truth="0"),
                model=ModelConfig(base_url=server.url, images=images),
            ),
            task_queue=worker.task_queue,
        )
    assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed, result.error
    [observation] = [m for m in result.messages if m.role == "tool"]
    assert observation.content == "[image: image/png, 12 KB]"  # what a text-only model reads
    assert len(endpoint.bodies) == 2
    return endpoint.bodies[1]


async def test_a_model_that_takes_images_gets_an_image_url_part(client: Client, tmp_path: Path) -> None:
    body = await _second_request(client, tmp_path, images=True)
    *_, tool, user = body["messages"]
    assert tool["role"] == "tool" and tool["content"] == "[image: image/png, 12 KB]"
    assert user["role"] == "user" and user["content"][0] == {"type": "text", "text": "Images returned by image:"}
    [part] = user["content"][1:]
    assert part["type"] == "image_url"
    prefix = "data:image/png;base64,"
    assert part["image_url"]["url"].startswith(prefix)
    assert len(base64.b64decode(part["image_url"]["url"][len(prefix) :])) == SIZE


async def test_a_text_model_reads_a_placeholder(client: Client, tmp_path: Path) -> None:
    body = await _second_request(client, tmp_path, images=False)
    assert body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": body["messages"][-2]["tool_calls"][0]["id"],
        "content": "[image: image/png, 12 KB]",
    }
    assert "image_url" not in json.dumps(body)


@pytest.mark.parametrize("tool_format", ["native", "hermes"])
def test_images_follow_the_whole_tool_run(tool_format: chat.ToolFormat) -> None:
    png = ToolAttachment(kind="image", mime_type="image/png", size_bytes=3, data="YWJj")
    a, b = call("a"), call("b")
    messages = [
        Message(role="user", content="q"),
        Message(role="assistant", tool_calls=[a, b]),
        Message(role="tool", content="[image: image/png, 3 B]", tool_call_id=a.id, name="a", images=[png]),
        Message(role="tool", content="text", tool_call_id=b.id, name="b"),
        Message(role="assistant", content="done"),
    ]
    wire = render_messages_with_images(messages, [], tool_format)
    plain = chat.render_messages(messages, [], tool_format)
    # The plain rendering, with one user message of images after the run (never inside it).
    assert len(wire) == len(plain) + 1 and wire[-1] == plain[-1]
    images = wire[-2]
    assert images["role"] == "user" and images["content"][1]["image_url"]["url"] == "data:image/png;base64,YWJj"
    assert wire[:-2] == plain[:-1]
    no_images = messages[:2]
    assert render_messages_with_images(no_images, [], tool_format) == chat.render_messages(no_images, [], tool_format)
