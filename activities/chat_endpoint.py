"""The HTTP half of OpenAI-compatible boundaries: `ChatEndpoint`, shared by the model and the judge.

`ChatEndpoint` owns one `aiohttp.ClientSession` per worker, so connections to the endpoint are reused
across rollouts. The client does not retry: Temporal's RetryPolicy is the only retry loop, and every
failure is raised as an `ApplicationError` whose type, given by the boundary (`EndpointErrors`),
says whether retrying can help (see gymflow.activities.model for the model's mapping). The API key
is sent as a bearer token and scrubbed from every error message.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gymflow.activities.errors import CONTEXT_LENGTH, non_retryable, retryable
from gymflow.activities.heartbeat import with_heartbeats
from gymflow.envs.contract import Usage

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
        # Made on first use, inside the worker's event loop. aiohttp, not httpx: with many requests
        # in flight httpx's pool polls every idle connection's socket per request, so its CPU per
        # request grows with the connections (docs/benchmarks.md: the model client was a large share
        # of the worker's CPU at saturation). No pool cap: the worker's activity slots bound it. Idle connections are
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
        """One chat completion, heartbeating while it runs (see `gymflow.activities.heartbeat.with_heartbeats`).

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
            response = await with_heartbeats(self._post(url, body, headers, timeout))
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
                delay = retry_after(response.headers.get("retry-after"))
                raise retryable(error, type=self.errors.retryable, retry_after=delay)
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


def retry_after(value: str | None) -> float | None:
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
