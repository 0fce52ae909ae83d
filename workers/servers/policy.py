"""An OpenAI-compatible HTTP server that puts any `gymflow.envs.policy.Policy` behind the model wire.

A rollout then runs end to end without a model: the `generate` activity talks real HTTP to this
server exactly as it would to vLLM, in either tool format, so the whole path (rendering, parsing,
error mapping, retries) is exercised by the demo and the tests.

* ``GET /v1/models`` lists one model (the policy's name unless ``model_name`` is given).
* ``POST /v1/chat/completions`` reads the request with `gymflow.envs.wire.chat.read_request`: a request with a
  ``tools`` parameter (or native tool messages) is native; otherwise it is hermes and the tools come
  from the ``<tools>`` block of the system prompt. The answer is rendered back in the same format.
* Token counts are estimates, ``ceil(chars / 4)``, good enough for context-budget logic; with
  ``max_context_tokens`` set, a longer prompt gets vLLM's 400 "maximum context length" error.
* Token data, as vLLM and SGLang return it when asked (`ModelConfig.tokens`): with
  ``return_token_ids`` the answer carries the prompt's and the completion's token ids, with
  ``logprobs`` one logprob per completion token (0.0: the policy is deterministic). The ids come
  from an exact byte-level tokeniser over a documented ChatML template (`gymflow.workers.servers.byte_tokens`), and
  the server keeps its own record of every prompt and completion (`TokenRecord`) so tests can check
  a trajectory's token sequence against what the server saw. A request with
  ``return_tokens_as_token_ids`` gets vLLM's shape (top-level ``prompt_token_ids``, logprob tokens
  ``token_id:N``), any other SGLang's (``prompt_token_ids`` on the choice).
* A malformed request gets a 400 with an OpenAI-style error body; a policy that raises gets a 500
  (a bug in the policy, which the caller retries like any server error).

`PolicyServer` runs in the caller's event loop on a socket it binds itself (port 0 picks a free
port, known before the first request), with uvicorn's signal handling left to the host process.
Its base, `AppServer`, serves any ASGI app the same way: tests needing faults (429, garbage
bodies) serve their own tiny apps with it instead of fault flags here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from gymflow.envs.contract import Message, ToolSpec
from gymflow.envs.errors import ChatFormatError
from gymflow.envs.policy import Policy
from gymflow.envs.wire import chat
from gymflow.workers.servers import byte_tokens

_STARTUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TokenRecord:
    """One completion as the server tokenised it (`gymflow.workers.servers.byte_tokens`)."""

    prompt_ids: list[int]
    completion_ids: list[int]


def build_app(
    policy: Policy,
    *,
    model_name: str | None = None,
    max_context_tokens: int | None = None,
    records: list[TokenRecord] | None = None,
    requests: list[str] | None = None,
) -> Starlette:
    """The ASGI app serving `policy` (what `PolicyServer` runs; usable with any ASGI server).

    Args:
        policy: The policy answering every completion.
        model_name: Name reported by ``/v1/models`` and in completions; defaults to ``policy.name``.
        max_context_tokens: When set, prompts estimated longer than this get a context-length 400.
        records: When given, every completion's prompt and completion token ids are appended to it.
        requests: When given, the fingerprint (`request_fingerprint`) of every request answered is
            appended to it: a test can tell a request answered twice.
    """
    name = model_name or policy.name

    async def models(request: Request) -> JSONResponse:
        del request
        entry = {"id": name, "object": "model", "created": 0, "owned_by": "gymflow"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def completions(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except (ValueError, RecursionError):
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        if body.get("stream"):
            return _error(400, "streaming is not supported", param="stream")
        try:
            parsed = chat.read_request(body.get("messages"), body.get("tools"))
        except ChatFormatError as exc:
            return _error(400, str(exc), param="messages")
        prompt_tokens = estimate_tokens(parsed.messages, parsed.tools)
        if max_context_tokens is not None and prompt_tokens > max_context_tokens:
            return _error(
                400,
                f"This model's maximum context length is {max_context_tokens} tokens. However, you requested "
                f"{prompt_tokens} tokens in the messages. Please reduce the length of the messages.",
                error_type="BadRequestError",
            )
        reply = policy.respond(parsed.messages, parsed.tools)
        wire = chat.assistant_to_wire(reply, parsed.tool_format)
        completion_tokens = estimate_tokens([reply], [])
        choice: dict[str, Any] = {
            "index": 0,
            "message": wire,
            "finish_reason": "tool_calls" if wire.get("tool_calls") else "stop",
            "logprobs": None,
        }
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or name),
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        prompt_ids = byte_tokens.prompt_ids(parsed.messages, parsed.tools)
        completion_ids = byte_tokens.completion_ids(reply)
        if records is not None:
            records.append(TokenRecord(prompt_ids, completion_ids))
        if requests is not None:
            requests.append(request_fingerprint(body))
        _add_token_data(body, answer, prompt_ids, completion_ids)
        return JSONResponse(answer)

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
        ]
    )


def _add_token_data(body: dict[str, Any], answer: dict[str, Any], prompt: list[int], completion: list[int]) -> None:
    """Token ids / logprobs in vLLM's or SGLang's shape, as far as the request asked for them."""
    choice = answer["choices"][0]
    vllm = bool(body.get("return_tokens_as_token_ids"))
    if body.get("return_token_ids"):
        (answer if vllm else choice)["prompt_token_ids"] = prompt
        choice["token_ids"] = completion
    if body.get("logprobs"):
        tokens = [f"token_id:{t}" if vllm else byte_tokens.decode([t]) for t in completion]
        choice["logprobs"] = {"content": [{"token": t, "logprob": 0.0, "top_logprobs": []} for t in tokens]}


def request_fingerprint(body: Any) -> str:
    """SHA-256 of a request body's canonical JSON (what `PolicyServer.requests` logs)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def estimate_tokens(messages: list[Message], tools: list[ToolSpec]) -> int:
    """``ceil(chars / 4)`` over message text, call names and arguments, and tool schemas."""
    chars = sum(len(m.content) for m in messages)
    for message in messages:
        for call in message.tool_calls:
            arguments = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
            chars += len(call.name) + len(arguments)
    chars += sum(len(json.dumps(tool.to_openai())) for tool in tools)
    return math.ceil(chars / 4)


def _error(status: int, message: str, *, param: str | None = None, error_type: str | None = None) -> JSONResponse:
    kind = error_type or "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the process embedding it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AppServer:
    """Any ASGI app served by uvicorn in the current event loop, in the background.

    Example:
        ``async with AppServer(app, port=0) as server: httpx.get(server.url + "/models")``

    Args:
        app: The ASGI app.
        host: Interface to bind.
        port: Port to bind; 0 picks a free one (read it back from `url` or `port`).
    """

    def __init__(self, app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._app = app
        self._host = host
        self._requested_port = port
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The bound port (only while started)."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL for an OpenAI client, ``http://HOST:PORT/v1``."""
        host = "127.0.0.1" if self._host in ("", "0.0.0.0") else self._host
        host = "[::1]" if host == "::" else (f"[{host}]" if ":" in host else host)
        return f"http://{host}:{self.port}/v1"

    async def start(self) -> None:
        """Bind the port (before returning, so `port` is known) and serve until `stop`."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._requested_port))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        # uvicorn owns the socket from here on and closes it at shutdown.
        config = uvicorn.Config(
            self._app,
            log_level="warning",
            log_config=None,  # uvicorn's records go to the process's handlers (gymflow.workers.logs), not its own
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"app-server:{self._port}")
        # uvicorn flips `started` once it accepts; poll it against a deadline.
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the startup error
                raise RuntimeError("server exited during startup")
            if time.monotonic() > deadline:
                await self.stop()
                raise TimeoutError(f"server did not start within {_STARTUP_TIMEOUT_S}s")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop serving and wait for the server to shut down. Idempotent."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None
        self._port = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class PolicyServer(AppServer):
    """A policy served over real HTTP in this event loop, for tests and the demo.

    Example:
        ``async with PolicyServer(policy, port=0) as server: ModelConfig(base_url=server.url)``

    Args:
        policy: The policy to serve.
        host: Interface to bind.
        port: Port to bind; 0 picks a free one (read it back from `url` or `port`).
        model_name: Reported model name; defaults to ``policy.name``.
        max_context_tokens: Optional context window for the vLLM-style context-length error.
        record_tokens: Keep every completion's token ids in `records` (tests of token exactness).
        record_requests: Keep every answered request's fingerprint in `requests` (tests that no
            request is answered twice).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str | None = None,
        max_context_tokens: int | None = None,
        record_tokens: bool = False,
        record_requests: bool = False,
    ) -> None:
        self.records: list[TokenRecord] = []
        """With `record_tokens`, every completion served, tokenised (`TokenRecord`), in order."""
        self.requests: list[str] = []
        """With `record_requests`, every answered request's fingerprint, in order."""
        app = build_app(
            policy,
            model_name=model_name,
            max_context_tokens=max_context_tokens,
            records=self.records if record_tokens else None,
            requests=self.requests if record_requests else None,
        )
        super().__init__(app, host=host, port=port)


def serve_forever(
    policy: Policy,
    *,
    host: str,
    port: int,
    model_name: str | None = None,
    max_context_tokens: int | None = None,
) -> None:
    """Serve `policy` until interrupted (``gymflow policy serve ENV``); blocks."""
    app = build_app(policy, model_name=model_name, max_context_tokens=max_context_tokens)
    uvicorn.run(app, host=host, port=port, log_level="warning", log_config=None, access_log=False)
