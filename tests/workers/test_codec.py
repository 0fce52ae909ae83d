"""Payload encryption: what the Temporal server stores is unreadable, and the codec server
(`gymflow codec-server`) lets the temporal CLI and the Web UI read it again."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import leaks
import pytest
from google.protobuf import json_format
from mcp_support import ROOT
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.history.v1 import History
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.errors import CodecKeyError
from gymflow.envs.mcp.http import free_port
from gymflow.workers.client import connect, data_converter
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.codec import (
    ENCODING,
    KEY_ID,
    SESSION_COOKIE,
    EncryptionCodec,
    EncryptionKey,
    codec_app,
    generate_key,
    session_token,
)
from gymflow.workers.servers.temporal import temporal_binary
from gymflow.workers.worker import running_worker
from support import make_settings

UI_ORIGIN = "http://localhost:8233"


def plain(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(text).encode())


async def test_round_trip_key_id_rotation_and_tampering() -> None:
    old, new = generate_key(), generate_key()
    before = EncryptionCodec.from_specs(f"k1:{old}")
    (sealed,) = await before.encode([plain("the prompt")])
    assert sealed.metadata["encoding"] == ENCODING and sealed.metadata[KEY_ID] == b"k1"
    assert b"the prompt" not in sealed.data
    rotated = EncryptionCodec.from_specs(f"k2:{new}", f"k1:{old}")  # new key encrypts, old still decrypts
    assert await rotated.decode([sealed]) == [plain("the prompt")]
    (resealed,) = await rotated.encode([plain("x")])
    assert resealed.metadata[KEY_ID] == b"k2"
    with pytest.raises(CodecKeyError, match="'k2'"):
        await before.decode([resealed])  # the old deployment lacks the new key: a clear error
    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata[KEY_ID] = b"k2"
    with pytest.raises(CodecKeyError, match="tampered or wrong key"):
        await rotated.decode([relabelled])  # the key id is authenticated
    assert await rotated.decode([plain("old")]) == [plain("old")]  # written before encryption: readable
    assert EncryptionKey.parse(old).id == EncryptionKey.parse(old).id != EncryptionKey.parse(new).id
    for bad in ("not base64!", "c2hvcnQ=", "bad id:" + old):
        with pytest.raises(CodecKeyError) as info:
            EncryptionKey.parse(bad)
        assert old not in str(info.value)


@contextlib.contextmanager
def codec_server(key: str, auth: str) -> Iterator[str]:
    """`gymflow codec-server` as a user starts it; yields its URL."""
    port = free_port()
    env = {**os.environ, "GYMFLOW_ENCRYPTION_KEY": key, "GYMFLOW_CODEC_AUTH": auth}
    process = subprocess.Popen(
        [sys.executable, "-m", "gymflow.workers.cli", "codec-server", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the codec server never listened"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def show(address: str, workflow_id: str, *codec: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [temporal_binary(), "workflow", "show", "--workflow-id", workflow_id, "-o", "json", "--address", address,
         *codec],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def test_encrypted_rollout_is_opaque_in_history_and_readable_through_the_codec_server(
    client: Client, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    key, auth = generate_key(), f"Bearer codec-{uuid.uuid4().hex}"
    settings = make_settings(tmp_path, encryption_key=key, codec_auth=auth)
    encrypting = await connect(temporal_address, data_converter=data_converter(settings))
    task = generate_tasks(1, seed=33)[0]
    workflow_id = f"encrypted-{uuid.uuid4().hex[:8]}"
    async with running_worker(encrypting, settings):
        result = await run_rollout(
            encrypting,
            RolloutInput(env="math", task=task, model=ModelConfig(base_url=calculator_policy_url)),
            task_queue=settings.task_queue,
            workflow_id=workflow_id,
        )
    assert result.reward is not None and result.reward.total == 1.0  # the worker reads its own payloads

    history = await client.get_workflow_handle(workflow_id).fetch_history()  # no key: the server's view
    started = history.events[0].workflow_execution_started_event_attributes.input.payloads[0]
    assert started.metadata["encoding"] == ENCODING and started.metadata[KEY_ID]
    raw = leaks.history_text(history)
    prompt = json.dumps(task.prompt)[1:-1]  # as it appears inside a JSON payload
    assert prompt not in raw and "<answer>" not in raw and "calculator" not in raw.lower()
    init_summary = f"init math task {task.id}"  # an activity's summary (user metadata) is encoded too
    assert init_summary not in raw

    with codec_server(key, auth) as url:
        decoded = show(temporal_address, workflow_id, "--codec-endpoint", url, "--codec-auth", auth)
        assert decoded.returncode == 0, decoded.stderr
        readable = leaks.history_text(json_format.Parse(decoded.stdout, History(), ignore_unknown_fields=True))
        assert prompt in readable and "<answer>" in readable and init_summary in readable
        refused = show(temporal_address, workflow_id, "--codec-endpoint", url, "--command-timeout", "2s")  # no auth
        assert refused.returncode != 0 or prompt not in refused.stdout
        async with httpx.AsyncClient(timeout=10) as http:
            body = json_format.MessageToJson(Payloads(payloads=[started]))
            direct = await http.post(f"{url}/decode", content=body, headers={"Authorization": auth})
            assert direct.status_code == 200
            (opened,) = json_format.Parse(direct.text, Payloads()).payloads
            assert opened.metadata["encoding"] == b"json/plain" and prompt.encode() in opened.data
            preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-namespace"}
            ui = await http.options(f"{url}/decode", headers={"Origin": UI_ORIGIN, **preflight})
            assert ui.status_code == 200 and ui.headers["access-control-allow-origin"] == UI_ORIGIN
            other = await http.options(f"{url}/decode", headers={"Origin": "http://evil.example", **preflight})
            assert "access-control-allow-origin" not in other.headers
            unauthorised = await http.post(f"{url}/decode", content=body)
            assert unauthorised.status_code == 401


async def test_browser_login_sets_a_session_cookie_the_codec_accepts() -> None:
    key, auth = generate_key(), f"Bearer codec-{uuid.uuid4().hex}"
    codec = EncryptionCodec.from_specs(key)
    (sealed,) = await codec.encode([plain("the prompt")])
    body = json_format.MessageToJson(Payloads(payloads=[sealed]))
    app = codec_app(codec, origins=[UI_ORIGIN], authorization=auth)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8081") as http:
        form = await http.get("/login")
        assert (
            form.status_code == 200 and 'name="auth"' in form.text and "Include cross-origin credentials" in form.text
        )
        assert (await http.post("/decode", content=body)).status_code == 401
        wrong = await http.post("/login", data={"auth": "Bearer nope"})
        assert wrong.status_code == 401 and not wrong.cookies
        right = await http.post("/login", data={"auth": auth})
        assert right.status_code == 200 and "Logged in" in right.text
        cookie = right.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}={session_token(auth)};")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert auth.split()[1] not in cookie  # the cookie is an HMAC, never the auth value itself
        decoded = await http.post("/decode", content=body, headers={"Origin": UI_ORIGIN})  # the client sends the cookie
        assert (
            decoded.status_code == 200 and b"the prompt" in json_format.Parse(decoded.text, Payloads()).payloads[0].data
        )
        assert decoded.headers["access-control-allow-credentials"] == "true"
        assert decoded.headers["access-control-allow-origin"] == UI_ORIGIN
        assert "logged in" in (await http.get("/login")).text
        http.cookies.set(SESSION_COOKIE, session_token("Bearer another value"))
        assert (await http.post("/decode", content=body)).status_code == 401
    open_app = codec_app(codec, origins=[UI_ORIGIN])  # no auth configured: nothing to log in to
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=open_app), base_url="http://localhost") as http:
        assert "requires no login" in (await http.get("/login")).text
        assert (await http.post("/decode", content=body)).status_code == 200
