"""Streamable-HTTP servers (per rollout and fixed URL), content rendering and output parsers."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import mcp_types
import pytest
from mcp_support import HTTP_COUNTER, MakeEnv, wait_until

from gymflow.envs.contract import ToolResult
from gymflow.envs.errors import InfraError
from gymflow.envs.mcp.content import apply_parser, load_parser, render_result
from gymflow.envs.mcp.http import free_port
from support import COUNTER_SERVER


async def test_per_rollout_http_servers_are_isolated_and_bound_to_loopback(make_env: MakeEnv) -> None:
    env = make_env({"counter": HTTP_COUNTER})
    await env.init_rollout("a")
    await env.init_rollout("b")
    assert (await env.run_tool("a", "increment", by=5)).text == "5"
    assert (await env.run_tool("b", "increment", by=7)).text == "7"
    urls = {r: env._get(r).sessions["counter"].http_process.url for r in ("a", "b")}  # type: ignore[union-attr]
    assert urls["a"] != urls["b"] and all(u and u.startswith("http://127.0.0.1:") for u in urls.values())
    pid = env.server_pids("a")["counter"]
    assert pid is not None and Path(f"/proc/{pid}/cwd").resolve() == env.workspace("a").resolve()
    await env.release_rollout("a")
    await wait_until(lambda: not Path(f"/proc/{pid}").exists(), what="the HTTP server to stop")


async def test_dead_http_server_is_an_infra_error(make_env: MakeEnv) -> None:
    env = make_env({"counter": HTTP_COUNTER})
    await env.init_rollout("r")
    pid = env.server_pids("r")["counter"]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    session = env._get("r").sessions["counter"]
    await wait_until(lambda: not session.alive, what="the session to notice the death")
    with pytest.raises(InfraError, match="exited with code -9"):
        await env.run_tool("r", "get")


@pytest.fixture
def fixed_server(tmp_path: Path) -> Iterator[str]:
    """A shared streamable-HTTP server that some other system runs."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(COUNTER_SERVER), "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            break
        assert time.monotonic() < deadline and process.poll() is None, "the fixed server never listened"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    process.kill()
    process.wait()


async def test_fixed_url_server(make_env: MakeEnv, fixed_server: str) -> None:
    env = make_env({"shared": {"url": fixed_server}})
    await env.init_rollout("r")
    assert env.server_pids("r") == {"shared": None}
    assert (await env.run_tool("r", "increment", by=2)).text == "2"


async def test_parsers_json_text_and_custom(make_env: MakeEnv) -> None:
    parsers = {"increment": "text", "pid": "json", "list_files": "json", "get": "mcp_support:shout"}
    env = make_env({"counter": {"command": "python", "args": [str(COUNTER_SERVER)], "parsers": parsers}})
    await env.init_rollout("r")
    assert (await env.run_tool("r", "increment", by=1)).structured is None
    pid = await env.run_tool("r", "pid")
    assert pid.structured == env.server_pids("r")["counter"]
    await env.run_tool("r", "write_note", name="a.txt", text="x")
    not_json = await env.run_tool("r", "list_files")  # two text blocks, not a JSON document
    assert not_json.is_error and "not valid JSON" in not_json.text and "a.txt" in not_json.text
    assert (await env.run_tool("r", "get")).text == "1"  # digits upper-case to themselves
    error = ToolResult(text="boom", is_error=True)
    assert await apply_parser(load_parser("mcp_support:shout"), error) is error  # errors pass untouched
    with pytest.raises(ValueError, match=r"mcpServers.counter.parsers.get: cannot load 'no_such_module'"):
        make_env({"counter": {"command": "python", "args": [str(COUNTER_SERVER)],
                              "parsers": {"get": "no_such_module:f"}}})  # fmt: skip


async def test_images_are_kept_inline_or_saved_to_the_workspace(make_env: MakeEnv, tmp_path: Path) -> None:
    env = make_env({"counter": {"command": "python", "args": [str(COUNTER_SERVER)], "max_inline_media_bytes": 1000}})
    await env.init_rollout("r")
    small = await env.run_tool("r", "image", size=600)
    (attachment,) = small.attachments
    assert attachment.kind == "image" and attachment.mime_type == "image/png" and attachment.size_bytes == 600
    assert attachment.data is not None and len(base64.b64decode(attachment.data)) == 600
    assert small.text == "[image: image/png, 600 B]"
    large = await env.run_tool("r", "image", size=5000)
    (saved,) = large.attachments
    assert saved.data is None and saved.workspace_path is not None and saved.workspace_path in large.text
    await env.copy_from_workspace("r", saved.workspace_path, tmp_path / "out.png")
    assert (tmp_path / "out.png").stat().st_size == 5000


def test_render_keeps_text_resources_and_names_links() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(text="a"),
            mcp_types.EmbeddedResource(resource=mcp_types.TextResourceContents(uri="file:///x", text="body")),
            mcp_types.EmbeddedResource(
                resource=mcp_types.BlobResourceContents(uri="file:///b", blob=base64.b64encode(b"xyz").decode())
            ),
            mcp_types.ResourceLink(uri="file:///l", name="l"),
        ],
        structured_content={"k": 1},
    )
    rendered = render_result(result, workspace=None, max_inline_bytes=2)
    assert rendered.text.split("\n")[:2] == ["a", "body"]
    assert "omitted: over the inline cap" in rendered.text and "[resource link file:///l]" in rendered.text
    (blob,) = rendered.attachments
    assert blob.kind == "resource" and blob.uri == "file:///b" and blob.size_bytes == 3 and blob.data is None
    assert rendered.structured == {"k": 1}
