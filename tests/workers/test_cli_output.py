"""What the CLI prints is usable: valid JSON always (null, never NaN), and links to the Web UI on the
port `gymflow server --ui-port` chose, in every command that prints one or serves the codec."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymflow.envs.mcp.http import free_port
from gymflow.workers.config import Settings
from gymflow.workers.servers.codec import generate_key
from gymflow.workers.servers.policy import AppServer
from gymflow.workers.servers.temporal import record

ROOT = Path(__file__).parents[2]


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"invalid JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def _gymflow(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, check=False,
    )  # fmt: skip


@pytest.mark.heavy
async def test_json_is_valid_when_every_rollout_infra_failed(temporal_address: str, tmp_path: Path) -> None:
    async def refuse(request: object) -> JSONResponse:
        return JSONResponse({"error": {"message": "no such model"}}, status_code=404)  # non-retryable: fails at once

    async with AppServer(Starlette(routes=[Route("/v1/chat/completions", refuse, methods=["POST"])])) as server:
        run = await asyncio.to_thread(  # the endpoint answers from this event loop meanwhile
            _gymflow,
            "rollout", "math", "--n", "2", "--model-url", server.url, "--json",
            "--address", temporal_address, "--task-queue", f"json-{uuid.uuid4().hex[:8]}", cwd=tmp_path,
        )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]  # infra failures: non-zero, but the output still parses
    report = _strict(run.stdout)
    assert report["summary"]["infra_failed"] == 2 and report["summary"]["mean_reward"] is None
    assert all(r["reward"] is None and r["termination"] == "model_error" for r in report["rollouts"])


def test_ui_port_is_taken_from_the_server_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMFLOW_UI_PORT", raising=False)
    settings = Settings(data_dir=tmp_path, temporal_address="localhost:7360")
    assert settings.web_ui_port == 8360  # nothing recorded: Temporal's default, frontend port + 1000
    record(data_dir=tmp_path, port=7360, ui_port=9123)
    assert settings.web_ui_port == 9123 and settings.ui_url == "http://localhost:9123/namespaces/default"
    assert Settings(data_dir=tmp_path, temporal_address="localhost:7361").web_ui_port == 8361  # another server
    assert Settings(data_dir=tmp_path, temporal_address="localhost:7360", ui_port=9000).web_ui_port == 9000
    (tmp_path / "server.json").write_text("not json")
    assert settings.web_ui_port == 8360
    assert (
        settings.ui_workflow_url("a/b", "r1") == "http://localhost:8360/namespaces/default/workflows/a%2Fb/r1/history"
    )


@pytest.mark.slow  # starts a whole server with its UI
def test_server_ui_port_reaches_the_ui_and_the_codec_server(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    data = tmp_path / "data"
    common = ["--data-dir", str(data), "--address", f"localhost:{port}"]
    started = _gymflow("server", "--background", "--ui-port", str(ui_port), *common, cwd=tmp_path)  # port: --address's
    assert started.returncode == 0, started.stderr
    assert f"on :{port};" in started.stderr
    assert f"UI at http://localhost:{ui_port}" in started.stderr
    codec = None
    try:
        deadline = time.monotonic() + 60
        while True:  # the UI is served on the port asked for
            try:
                if httpx.get(f"http://localhost:{ui_port}/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the Web UI did not come up"
            time.sleep(0.5)
        codec_port = free_port()
        codec = subprocess.Popen(
            [sys.executable, "-m", "gymflow.workers.cli", "codec-server", "--port", str(codec_port), *common],
            cwd=tmp_path, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "GYMFLOW_ENCRYPTION_KEY": generate_key()},
        )  # fmt: skip
        assert codec.stderr is not None
        banner = codec.stderr.readline()
        assert f"origins http://localhost:{ui_port}, http://127.0.0.1:{ui_port}" in banner, banner
        status = _gymflow("status", *common, cwd=tmp_path)
        assert status.returncode == 0 and "rollouts running: 0" in status.stdout, status.stderr
    finally:
        if codec is not None:
            codec.terminate()
            codec.wait(timeout=30)
        _gymflow("server", "--stop", *common, cwd=tmp_path)
