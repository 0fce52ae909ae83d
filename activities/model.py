"""The model boundary: one chat completion against an OpenAI-compatible endpoint.

`ModelActivities` owns one `aiohttp.ClientSession` per worker, so connections to the model server
are reused across rollouts. The client does not retry: Temporal's RetryPolicy is the only retry
loop, and every failure is raised as an `ApplicationError` whose type says whether retrying can
help (see `gymflow.activities.errors`):

* connection errors, timeouts, HTTP 408/409/429/5xx, and a 200 that is not a chat completion ->
  retryable ``MODEL_ERROR`` (``Retry-After`` becomes ``next_retry_delay``);
* a 400 about the context length -> non-retryable ``CONTEXT_LENGTH`` (the workflow ends the rollout
  with ``TerminationReason.CONTEXT_BUDGET``; the next attempt would be just as long);
* any other 4xx, or no endpoint configured -> non-retryable ``MODEL_REJECTED``.

`ModelConfig` travels in workflow input and history, so it holds no secrets: the API key is worker
configuration, passed to `ModelActivities`, and scrubbed from every error message.

The HTTP half (`ChatEndpoint`: the owned client, the key, heartbeats and the error mapping) is
shared with the judge activity (`gymflow.activities.judge`), which maps the same failures to its own
error types (`EndpointErrors`).
"""

from __future__ import annotations

import email.utils
import json
import math
import time
import urllib.request
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import aiohttp
from pydantic import Field
from temporalio import activity

from gymflow.activities.errors import CONTEXT_LENGTH, MODEL_ERROR, MODEL_REJECTED, non_retryable, retryable
from gymflow.activities.heartbeat import heartbeating, third_of_timeout
from gymflow.envs.contract import Message, ToolSpec, Usage, Wire, json_bytes
from gymflow.envs.wire import chat
from gymflow.envs.wire.images import render_messages_with_images
from gymflow.envs.wire.tokens import TokenPrefix, TurnTokens, completion_token_data, turn_tokens

_T = TypeVar("_T")

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_CONTEXT_MARKERS = (
    "maximum context length",
    "context_length_exceeded",
    "maximum model length",
    "context window",
    "too long",
)
_EXCERPT_CHARS = 300


KEEPALIVE_S = 4.0
"""Seconds an idle connection to a model endpoint is kept for reuse."""


class ModelConfig(Wire):
    """Which model to call and how to sample. Part of workflow input: never put secrets here."""

    base_url: str | None = None
    """OpenAI-compatible base URL including ``/v1`` (``http://host:8000/v1``); None uses the
    worker's default."""
    model: str = Field(default="", max_length=512)
    """Model name sent to the server; empty uses the worker's default (or the server's only model)."""
    tool_format: Literal["native", "hermes"] = "native"
    """``native``: OpenAI ``tools``/``tool_calls``. ``hermes``: tools in the system prompt and
    ``<tool_call>`` text, for servers without a tool-call parser."""
    temperature: float | None = Field(default=None, ge=0)
    """Sampling temperature; None leaves the server's default."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling mass; None leaves the server's default."""
    max_tokens: int | None = Field(default=1024, ge=1)
    """Most tokens one completion may generate; None leaves the server's default."""
    seed: int | None = None
    """Sampling seed, for servers that honour it."""
    stop: list[str] | None = None
    """Stop sequences."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra request fields (``top_k``, ``chat_template_kwargs``, ...), merged in last as the
    OpenAI client's ``extra_body`` is."""
    request_timeout_s: float = Field(default=300, gt=0, le=7 * 24 * 3600)
    """Seconds to wait for one completion before the attempt fails (and is retried)."""
    tokens: Literal["off", "vllm", "sglang"] = "off"
    """Record per turn the prompt and completion token ids and logprobs (`Trajectory.tokens`):
    ``vllm`` asks with ``logprobs``, ``return_token_ids`` and ``return_tokens_as_token_ids`` (vLLM
    0.10.2+ answers ``prompt_token_ids``/``token_ids``; older ones only the ``token_id:N`` logprob
    tokens), ``sglang`` with ``logprobs`` and ``return_token_ids``. Either shape of answer is read.
    A turn whose answer has no token data is recorded without (`Trajectory.token_sequence` names it)."""
    images: bool = False
    """The model takes images: the images MCP tools return reach it as OpenAI ``image_url`` parts
    (``data:`` URLs, in a user message after the tool results). Off, it reads the tool text's
    placeholder for each (``[image: image/png, 12 KB]``)."""
    local_activity: bool = False
    """Run each turn as a local activity of the workflow's worker: one server round trip per turn
    fewer and no conversation in history, for short turns. A generation then holds a workflow task
    slot while it runs, and stopping a worker waits for its in-flight turns (gymflow.workflows.rollout)."""


class GenerateInput(Wire):
    """One model turn of a rollout."""

    compact_json = True

    model: ModelConfig
    """Endpoint and sampling settings."""
    messages: list[Message]
    """The conversation so far, system prompt first."""
    tools: list[ToolSpec] = Field(default_factory=list)
    """Tools the model may call."""
    rollout_id: str
    """The rollout this turn belongs to (for logs)."""
    turn: int
    """Turn number within the rollout; makes generated tool call ids unique."""
    token_prefix: TokenPrefix | None = None
    """The previous turn's prompt + completion tokens (length, digest), when token data is on: the
    prompt is checked to extend it and only the new tokens are recorded (gymflow.envs.wire.tokens)."""


class GenerateResult(Wire):
    """The model's answer for one turn."""

    compact_json = True

    message: Message
    """The assistant message. Tool calls are parsed (malformed ones kept with ``parse_error``); in
    hermes format the content is the model's text verbatim, ``<tool_call>`` blocks included, so
    the transcript holds exactly what the model wrote and shows it to the model next turn."""
    finish_reason: str
    """As the server reported it: ``stop``, ``tool_calls``, ``length``, ..."""
    usage: Usage
    """This turn's tokens; ``last_prompt_tokens`` equals ``prompt_tokens``."""
    model: str
    """The model name the server reported."""
    tokens: TurnTokens | None = None
    """This turn's token ids and logprobs, when `ModelConfig.tokens` is on and the endpoint gave them."""
    token_prefix: TokenPrefix | None = None
    """This turn's prompt + completion, for the next turn's `GenerateInput.token_prefix`."""


@dataclass(frozen=True)
class EndpointErrors:
    """How one OpenAI-compatible boundary names its failures (see the module docstring)."""

    retryable: str
    """ApplicationError type of failures a later attempt may not have."""
    rejected: str
    """ApplicationError type of requests the endpoint will never accept."""
    name: str
    """The endpoint's name in messages (``model``, ``judge``)."""
    url_source: str
    """Where its URL comes from, named when the URL is missing or invalid."""


REPLY_SLACK_BYTES = 64 * 1024
"""Room a reply leaves, under the payload limit, for the rest of what carries it."""
MODEL_ENDPOINT = EndpointErrors(
    retryable=MODEL_ERROR,
    rejected=MODEL_REJECTED,
    name="model",
    url_source="ModelConfig.base_url or the worker's default model URL",
)


class ChatEndpoint:
    """POSTs to OpenAI-compatible ``/chat/completions`` endpoints with gymflow's error mapping.

    Args:
        errors: The error types to raise.
        api_key: Sent as ``Authorization: Bearer``; never logged or put in errors.
        http: A client to use instead of the owned one (tests); the caller closes it.
    """

    def __init__(
        self, *, errors: EndpointErrors, api_key: str | None = None, http: aiohttp.ClientSession | None = None
    ) -> None:
        self.errors = errors
        self._api_key = api_key
        self._owns_http = http is None
        self._http = http
        self._proxies: dict[tuple[str, str], str | None] = {}

    def _session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the worker's event loop. aiohttp, not httpx: at 16-128 requests
        # in flight httpx spent 3.2 ms of CPU per request (its pool polls every idle connection's
        # socket per request), aiohttp 0.3 ms (bench/: the model client was 21% of the worker's CPU
        # at saturation). No pool cap: the worker's activity slots bound it. Idle connections are
        # dropped before uvicorn's 5 s keep-alive (vLLM's and SGLang's servers) closes them: reusing
        # one the server is closing fails the request (a disconnect the bench saw, costing a retry).
        # HTTP(S)_PROXY / NO_PROXY apply (`_proxy`), as they did with httpx; not through aiohttp's
        # trust_env, which reads the environment and ~/.netrc in a thread for every request.
        if self._http is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            self._http = aiohttp.ClientSession(connector=connector)
        return self._http

    def _proxy(self, url: str) -> str | None:
        """The proxy the environment sets for `url`'s host (None: direct), looked up once per host."""
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc)
        if key not in self._proxies:
            proxies = urllib.request.getproxies_environment()
            host = parts.hostname or ""
            bypass = urllib.request.proxy_bypass_environment(host, proxies)  # type: ignore[attr-defined]
            self._proxies[key] = None if bypass else proxies.get(parts.scheme)
        return self._proxies[key]

    async def aclose(self) -> None:
        """Close the owned HTTP client (a client passed in is left to its owner)."""
        if self._owns_http and self._http is not None:
            await self._http.close()
            self._http = None

    async def complete(self, base_url: str | None, body: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """One chat completion, heartbeating while it runs (see `_heartbeating`).

        Args:
            base_url: The endpoint including ``/v1``; None or empty is a rejected request.
            body: The request body.
            timeout_s: Seconds to wait for the answer (connecting: at most 30).

        Returns:
            The response body, checked to have the shape of a chat completion
            (``choices[0].message`` an object).

        Raises:
            ApplicationError: ``errors.retryable`` for connection failures, timeouts, HTTP
                408/409/429/5xx (with Retry-After as ``next_retry_delay``) and a 200 that is not a
                chat completion; non-retryable ``CONTEXT_LENGTH`` for a 400 about the context
                length; non-retryable ``errors.rejected`` for other 4xx and missing or invalid URLs.
        """
        name, source = self.errors.name, self.errors.url_source
        if not base_url:
            raise non_retryable(f"no {name} endpoint: set {source}", type=self.errors.rejected)
        url = base_url.rstrip("/") + "/chat/completions"
        if not _is_http_url(url):  # a bad URL will not get better
            raise non_retryable(
                self.scrub(f"invalid {name} endpoint {url!r} ({source}): not an http(s) URL with a host"),
                type=self.errors.rejected,
            )
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, 30.0))
        try:
            response = await _heartbeating(self._post(url, body, headers, timeout))
        except aiohttp.InvalidURL as exc:
            raise non_retryable(
                self.scrub(f"invalid {name} endpoint {url!r} ({source}): {exc}"), type=self.errors.rejected
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:  # connect/read/write errors and timeouts
            detail = str(exc) or "timed out"
            raise retryable(
                self.scrub(f"{name} request to {url} failed: {type(exc).__name__}: {detail}"),
                type=self.errors.retryable,
            ) from None
        status = response.status
        excerpt = self.scrub(" ".join(response.text.split())[:_EXCERPT_CHARS])
        if not 200 <= status < 300:
            error = f"{name} endpoint returned HTTP {status}: {excerpt}"
            if status in _RETRYABLE_STATUS or status >= 500:
                retry_after = _retry_after(response.headers.get("retry-after"))
                raise retryable(error, type=self.errors.retryable, retry_after=retry_after)
            if status == 400 and any(marker in response.text.lower() for marker in _CONTEXT_MARKERS):
                raise non_retryable(error, type=CONTEXT_LENGTH)
            raise non_retryable(error, type=self.errors.rejected)
        completion = _completion(response)
        if completion is None:
            # Retried, not rejected: a 200 that is not a chat completion is usually a proxy or load
            # balancer answering for a server that is restarting, which a later attempt outlives.
            raise retryable(
                f"{name} endpoint returned a 200 that is not a chat completion: {excerpt}", type=self.errors.retryable
            )
        return completion

    async def _post(
        self, url: str, body: dict[str, Any], headers: dict[str, str], limits: aiohttp.ClientTimeout
    ) -> _Response:
        post = self._session().post(url, json=body, headers=headers, timeout=limits, proxy=self._proxy(url))
        async with post as response:
            content = await response.read()
            return _Response(status=response.status, headers=response.headers, content=content)

    def scrub(self, text: str) -> str:
        """Remove the API key from text that may end up in an error (servers echo headers)."""
        return text.replace(self._api_key, "***") if self._api_key else text


def chat_body(
    config: ModelConfig, messages: list[dict[str, Any]], *, default_model: str = "", tools: Any = None
) -> dict[str, Any]:
    """A chat completion request: messages, model name, tools, the sampling settings that are set,
    and `ModelConfig.extra_body` merged in last."""
    body: dict[str, Any] = {"messages": messages}
    model = config.model or default_model
    if model:  # vLLM and SGLang serve their only model when none is named
        body["model"] = model
    if tools is not None:
        body["tools"] = tools
    sampling = {
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_tokens": config.max_tokens,
        "seed": config.seed,
        "stop": config.stop,
    }
    body.update((key, value) for key, value in sampling.items() if value is not None)
    if config.tokens != "off":
        body.update(logprobs=True, top_logprobs=0, return_token_ids=True)
        if config.tokens == "vllm":
            body["return_tokens_as_token_ids"] = True
    body.update(config.extra_body)
    return body


def completion_usage(completion: dict[str, Any]) -> Usage:
    """The token counts of a chat completion (0 where the server left them out)."""
    usage = completion.get("usage")
    if not isinstance(usage, dict):  # some servers leave usage out
        usage = {}
    prompt_tokens = _int(usage.get("prompt_tokens"))
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=_int(usage.get("completion_tokens")),
        last_prompt_tokens=prompt_tokens,
    )


class ModelActivities:
    """Activities for OpenAI-compatible chat endpoints (vLLM, SGLang, OpenAI, the policy server).

    Args:
        default_base_url: Endpoint used when `ModelConfig.base_url` is None.
        default_model: Model name used when `ModelConfig.model` is empty.
        api_key: Sent as ``Authorization: Bearer``; never logged or put in errors.
        http: A client to use instead of the owned one (tests); the caller closes it.
        payload_limit_bytes: The largest payload the deployment's history takes inline (None:
            large payloads go to external storage); a reply over it is refused, not sent.
    """

    def __init__(
        self,
        *,
        default_base_url: str | None,
        default_model: str = "",
        api_key: str | None = None,
        http: aiohttp.ClientSession | None = None,
        payload_limit_bytes: int | None = None,
    ) -> None:
        self._payload_limit_bytes = payload_limit_bytes
        self._default_base_url = default_base_url
        self._default_model = default_model
        self._endpoint = ChatEndpoint(errors=MODEL_ENDPOINT, api_key=api_key, http=http)

    async def aclose(self) -> None:
        """Close the owned HTTP client (a client passed in is left to its owner)."""
        await self._endpoint.aclose()

    @property
    def default_model(self) -> str:
        """The model name used when `ModelConfig.model` is empty."""
        return self._default_model

    @property
    def payload_limit_bytes(self) -> int | None:
        """The largest reply the deployment's history takes inline (None: no limit)."""
        return self._payload_limit_bytes

    async def complete(self, config: ModelConfig, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion of `body` at `config`'s endpoint (the worker's default when it names
        none), with this worker's key and error mapping (`ChatEndpoint.complete`)."""
        return await self._endpoint.complete(
            config.base_url or self._default_base_url, body, timeout_s=config.request_timeout_s
        )

    @activity.defn(name="generate")
    async def generate(self, input: GenerateInput) -> GenerateResult:
        """Ask the model for the next assistant message.

        Raises:
            ApplicationError: ``MODEL_ERROR`` (retryable), ``CONTEXT_LENGTH`` or ``MODEL_REJECTED``
                (non-retryable); see the module docstring.
        """
        config = input.model
        render = render_messages_with_images if config.images else chat.render_messages
        body = chat_body(
            config,
            render(input.messages, input.tools, config.tool_format),
            default_model=self._default_model,
            tools=chat.render_tools(input.tools, config.tool_format),
        )
        completion = await self._endpoint.complete(
            config.base_url or self._default_base_url, body, timeout_s=config.request_timeout_s
        )
        choice = completion["choices"][0]
        message = chat.parse_assistant_message(choice["message"], config.tool_format, id_prefix=f"call_{input.turn}")
        result = GenerateResult(
            message=message,
            finish_reason=str(choice.get("finish_reason") or ""),
            usage=completion_usage(completion),
            model=str(completion.get("model") or config.model or self._default_model),
        )
        if config.tokens != "off":
            prompt_ids, completion_ids, logprobs = completion_token_data(completion)
            if prompt_ids is not None and completion_ids is not None:
                result.tokens, result.token_prefix = turn_tokens(
                    turn=input.turn,
                    prompt_ids=prompt_ids,
                    completion_ids=completion_ids,
                    logprobs=logprobs,
                    prefix=input.token_prefix,
                )
        limit = self._payload_limit_bytes
        if limit is not None and (size := json_bytes(result)) > limit - REPLY_SLACK_BYTES:
            # Temporal would refuse to record it (and word it as TMPRL1103); no model turn is this long.
            raise non_retryable(
                f"the model's reply is {size} bytes, over the {limit}-byte payload limit of this "
                "deployment's history (a broken endpoint?); set GYMFLOW_PAYLOAD_STORAGE_URI to store "
                "large payloads externally",
                type=MODEL_ERROR,
            )
        return result


async def _heartbeating(awaitable: Awaitable[_T]) -> _T:
    """Await, heartbeating at a third of the heartbeat timeout when the activity has one.

    A long generation then reveals a dead worker within the heartbeat timeout instead of
    start_to_close, and activity cancellation reaches the request.
    """
    return await heartbeating(awaitable, third_of_timeout(0.05))


@dataclass(frozen=True)
class _Response:
    """A finished HTTP response, read whole."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _completion(response: _Response) -> dict[str, Any] | None:
    """The JSON body if it has the shape of a chat completion (``choices[0].message`` an object)."""
    try:
        body = json.loads(response.content)
    except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
        return None
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return body if isinstance(choices[0].get("message"), dict) else None


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
