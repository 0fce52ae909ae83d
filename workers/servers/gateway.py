"""The model gateway: each worker node's HTTP endpoint through which unmodified agent programs call models.

A harness rollout's program (gymflow.envs.harness) gets base URLs and an API key naming a token
the node's gateway admitted for it (`Gateway.admit`, called by the `run_program` activity). It
speaks three APIs, each with its own error shape:

* OpenAI Chat Completions, ``POST …/v1/chat/completions``, plain and streamed;
* OpenAI Responses, ``POST …/v1/responses``, plain and streamed, with ``previous_response_id``;
* Anthropic Messages, ``POST …/v1/messages``, plain and streamed.

Each request is checked and converted to the chat request it means (gymflow.envs.wire.streams,
.responses, .messages); a malformed one is answered at once with a 400 in the API's shape, a wrong
or revoked token with a 401. A good one becomes a Temporal Update (`model_call`) of the rollout's
workflow run, whose handler answers it from the rollout's record or runs the `model_call` activity
(gymflow.workflows.harness); the update's result, a chat completion, is rendered back in the
program's API, as one JSON body or as the server-sent events of a stream.

Why an Update: the answer a program gets is the one recorded in the rollout's history, and only
then; the workflow decides everything (budgets, replay after a crash, which upstream), so the
gateway holds no state a crash could lose but the ``previous_response_id`` chains of programs it
runs (a restarted program starts its chain again). Each request's update has an id of its own, and
transient RPC failures are retried with that id, which Temporal deduplicates.

URLs: ``http://HOST:PORT/r/<token>/v1/...`` (the token in the path) or ``http://HOST:PORT/v1/...``
with the token as the API key (``Authorization: Bearer`` or ``x-api-key``). A request naming two
different tokens is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities import errors
from gymflow.activities.gateway import MODEL_CALL_UPDATE, Api, GatewayAnswer, GatewayCall
from gymflow.activities.harness import Admission
from gymflow.envs.wire import messages, responses, streams
from gymflow.envs.wire.chat import ChatFormatError
from gymflow.workers.servers.policy import AppServer

log = logging.getLogger(__name__)

CHAIN_LIMIT = 256
"""Responses kept per program for ``previous_response_id`` (the oldest are forgotten)."""
UPDATE_DEADLINE_S = 3600.0
"""How long one call may wait for its answer (a slow model, a rollout recovering) before a 503."""
_TRANSIENT = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.RESOURCE_EXHAUSTED})


@dataclass(frozen=True)
class Target:
    """Where a token's calls go."""

    workflow_id: str
    run_id: str
    start: int


class GatewayError(Exception):
    """A request answered with an error: its status, message and (for OpenAI shapes) the param at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


class Gateway(AppServer):
    """The node's model gateway, served in the worker's event loop.

    Args:
        client: The worker's Temporal client (updates go through it).
        host: Interface to bind (programs run on this node: loopback by default).
        port: Port to bind; 0 picks a free one.
    """

    def __init__(self, client: Client, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._client = client
        self._routes: dict[str, Target] = {}
        self._chains: dict[str, OrderedDict[str, list[dict[str, Any]]]] = {}
        routes: list[Route] = []
        for prefix in ("/r/{token}/v1", "/v1"):
            routes += [
                Route(f"{prefix}/chat/completions", self._chat, methods=["POST"]),
                Route(f"{prefix}/responses", self._responses, methods=["POST"]),
                Route(f"{prefix}/messages", self._messages, methods=["POST"]),
                Route(f"{prefix}/models", self._models, methods=["GET"]),
            ]
        app = Starlette(routes=routes, exception_handlers={404: self._not_found, 405: self._not_found})
        super().__init__(app, host=host, port=port)

    # -- admission (the run_program activity) -------------------------------------------------
    def admit(self, *, workflow_id: str, run_id: str, start: int) -> Admission:
        """A fresh token routed to this rollout's run and program start, and the URLs that carry it."""
        token = "gf-" + secrets.token_urlsafe(24)
        self._routes[token] = Target(workflow_id, run_id, start)
        base = self.url.removesuffix("/v1") + f"/r/{token}"
        return Admission(token=token, openai_base_url=f"{base}/v1", anthropic_base_url=base)

    def revoke(self, token: str) -> None:
        """Forget a token: its program's later calls are refused (401)."""
        self._routes.pop(token, None)
        self._chains.pop(token, None)

    # -- the APIs ------------------------------------------------------------------------------
    async def _chat(self, request: Request) -> Response:
        async def answer(token: str, route: Target, body: Any) -> Response:
            try:
                chat = streams.program_request(body)
            except ChatFormatError as exc:
                raise GatewayError(400, str(exc), param="messages") from None
            completion = (await self._call(route, chat, "chat")).completion
            if streams.wants_stream(body):
                return _event_stream(streams.chat_stream(completion, usage=streams.include_usage(body)))
            return JSONResponse(completion)

        return await self._serve(request, "chat", answer)

    async def _responses(self, request: Request) -> Response:
        async def answer(token: str, route: Target, body: Any) -> Response:
            chain = self._chains.setdefault(token, OrderedDict())
            previous = None
            if isinstance(body, dict) and body.get("previous_response_id") is not None:
                previous = chain.get(str(body["previous_response_id"]))
                if previous is None:
                    raise GatewayError(
                        400,
                        f"Previous response with id '{body['previous_response_id']}' not found.",
                        param="previous_response_id",
                    )
            try:
                chat = responses.to_chat(body, previous)
            except ChatFormatError as exc:
                raise GatewayError(400, str(exc), param="input") from None
            completion = (await self._call(route, chat, "responses")).completion
            response = responses.from_chat(
                completion, body, model=str(body.get("model") or completion.get("model", ""))
            )
            chain[response["id"]] = responses.conversation(chat, completion)
            while len(chain) > CHAIN_LIMIT:
                chain.popitem(last=False)
            if streams.wants_stream(body):
                return _event_stream(b"".join(streams.sse(data, kind) for kind, data in responses.events(response)))
            return JSONResponse(response)

        return await self._serve(request, "responses", answer)

    async def _messages(self, request: Request) -> Response:
        async def answer(token: str, route: Target, body: Any) -> Response:
            try:
                chat = messages.to_chat(body)
            except ChatFormatError as exc:
                raise GatewayError(400, str(exc)) from None
            completion = (await self._call(route, chat, "messages")).completion
            message = messages.from_chat(completion, model=str(body.get("model") or completion.get("model", "")))
            if streams.wants_stream(body):
                return _event_stream(b"".join(streams.sse(data, kind) for kind, data in messages.events(message)))
            return JSONResponse(message)

        return await self._serve(request, "messages", answer)

    async def _models(self, request: Request) -> Response:
        try:
            self._route(self._token(request, "chat"))
        except GatewayError as exc:
            return _error("chat", exc)
        entry = {"id": "gymflow-rollout", "object": "model", "created": 0, "owned_by": "gymflow"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        del exc
        api: Api = "messages" if request.url.path.endswith("/messages") else "chat"
        return _error(api, GatewayError(404, f"no route {request.method} {request.url.path} on the model gateway"))

    # -- plumbing ------------------------------------------------------------------------------
    async def _serve(
        self, request: Request, api: Api, answer: Callable[[str, Target, Any], Awaitable[Response]]
    ) -> Response:
        try:
            token = self._token(request, api)
            route = self._route(token)
            try:
                body = json.loads(await request.body())
            except (ValueError, RecursionError):
                raise GatewayError(400, "the request body is not valid JSON") from None
            return await answer(token, route, body)
        except GatewayError as exc:
            return _error(api, exc)
        except Exception as exc:  # a bug here must still answer in the API's shape, not hang or speak HTML
            log.exception("the gateway failed a request")
            return _error(api, GatewayError(500, f"the gateway failed: {type(exc).__name__}: {exc}"))

    def _route(self, token: str) -> Target:
        route = self._routes.get(token)
        if route is None:
            raise GatewayError(401, "invalid API key: no running rollout has this token", code="invalid_api_key")
        return route

    def _token(self, request: Request, api: Api) -> str:
        in_path = request.path_params.get("token")
        authorization = request.headers.get("authorization", "")
        key = request.headers.get("x-api-key") or (authorization[7:] if authorization[:7].lower() == "bearer " else "")
        if in_path and key and key != in_path:
            raise GatewayError(401, "the API key and the URL name different rollout tokens", code="invalid_api_key")
        token = in_path or key
        if not token:
            raise GatewayError(
                401, "no API key: use the rollout's OPENAI_API_KEY / ANTHROPIC_API_KEY", code="invalid_api_key"
            )
        return str(token)

    async def _call(self, route: Target, chat: dict[str, Any], api: Api) -> GatewayAnswer:
        """The rollout's answer to one call, through an update (retried with its id on transient RPC errors)."""
        handle = self._client.get_workflow_handle(route.workflow_id, run_id=route.run_id)
        call = GatewayCall(request=chat, api=api, start=route.start)
        update_id = f"call-{uuid.uuid4().hex}"
        deadline = time.monotonic() + UPDATE_DEADLINE_S
        delay = 0.1
        while True:
            try:
                answer: GatewayAnswer = await handle.execute_update(
                    MODEL_CALL_UPDATE, call, id=update_id, result_type=GatewayAnswer
                )
                return answer
            except WorkflowUpdateFailedError as exc:
                raise _refused(exc.cause) from None
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    raise GatewayError(400, "the rollout is over: it takes no more model calls") from None
                if exc.status not in _TRANSIENT or time.monotonic() > deadline:
                    raise GatewayError(503, f"the rollout did not answer: {exc.message}") from None
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                if time.monotonic() > deadline:
                    raise GatewayError(503, "the rollout did not answer in time") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def _refused(cause: BaseException | None) -> GatewayError:
    """The HTTP error for an update the rollout refused or failed."""
    message = str(cause) if cause is not None else "the model call failed"
    kind = cause.type if isinstance(cause, ApplicationError) else None
    if kind == errors.CONTEXT_LENGTH:
        return GatewayError(400, message, param="messages", code="context_length_exceeded")
    if kind in (errors.CALL_REFUSED, errors.MODEL_REJECTED, "ValueError", None):
        return GatewayError(400, message)
    return GatewayError(502, message)


def _error(api: Api, exc: GatewayError) -> JSONResponse:
    if api == "messages":
        body = messages.error_body(exc.status, str(exc))
    else:
        body = responses.error_body(exc.status, str(exc), param=exc.param)
        body["error"]["code"] = exc.code
    return JSONResponse(body, exc.status)


def _event_stream(body: bytes) -> Response:
    return Response(body, media_type="text/event-stream", headers={"cache-control": "no-cache"})
