"""Model calls of dataset generation that are never made twice once they completed.

A generation batch makes tens of model calls (generate, judge, label) inside one activity. When
its worker dies mid-batch, Temporal retries the activity and the retry would make every call
again. Instead of one activity per call (DESIGN: never one activity per item; 2 x 1,000 activity
round trips per 1,000 items), each call's reply is written to storage as soon as it arrives,
keyed by a hash of what was asked, and every attempt looks there first:

    <dataset URI>/work/<workflow id>/calls/<sha256(purpose, candidate, request body)>.json

So a retried batch re-asks only the calls that had not completed, and the batch's output is a
pure function of the recorded replies: a re-run writes the same bytes. The only calls made again
are those in flight when the worker died (asked, not yet answered and recorded). The record holds
the completion, the time it was stored (``stored_at``, Unix seconds) and the SHA-256 of the request
body (``request_sha256``), which the crash test matches with the model server's request log. Each
request names its item (judge and label prompts carry the candidate's id), so no two calls of a run
send the same body.

Errors: a retryable failure (connection, timeout, 5xx, 429, a 200 that is not a completion) is
raised on every attempt but the last, after the batch's other calls are recorded, so Temporal's
RetryPolicy (the only retry loop) retries just those calls; on the last attempt it becomes the
candidate's rejection (``model_error`` / ``judge_error``). A non-retryable one (4xx, context
length) is a rejection at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

from temporalio.exceptions import ApplicationError

from gymflow.activities.chat_endpoint import ChatEndpoint
from gymflow.activities.judge import JUDGE_ENDPOINT
from gymflow.activities.model import MODEL_ENDPOINT, ModelConfig, chat_body
from gymflow.activities.storage import Store
from gymflow.envs.errors import StorageError


class CallFailed(Exception):
    """A call failed for good in this attempt: the candidate's rejection reason and detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class CallStore:
    """Recorded completions of one generation run, in its dataset's store.

    Args:
        store: The dataset's store.
        prefix: ``work/<workflow id>/calls``.
        model: Endpoint of the generation model (the worker's model API key).
        judge: Endpoint of the judge (the worker's judge API key).
        final_attempt: Turn retryable failures into rejections instead of raising them.
        retried: This is not the batch's first attempt: look for recorded replies first.
        limit: Calls in flight at most.
    """

    def __init__(
        self,
        store: Store,
        prefix: str,
        *,
        model: ChatEndpoint,
        judge: ChatEndpoint,
        default_model_url: str | None,
        default_judge_url: str | None,
        final_attempt: bool,
        retried: bool,
        limit: int,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.endpoints = {"model": (model, default_model_url), "judge": (judge, default_judge_url)}
        self.final_attempt = final_attempt
        self.retried = retried
        self._slots = asyncio.Semaphore(limit)
        self.made = 0
        self.reused = 0
        self.pending_error: ApplicationError | None = None
        """The first retryable failure of this attempt, raised once the batch's other calls are done."""

    def key(self, purpose: str, candidate: str, body: dict[str, Any]) -> str:
        canonical = json.dumps({"purpose": purpose, "candidate": candidate, "body": body}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    async def complete(
        self, purpose: str, candidate: str, config: ModelConfig, messages: list[dict[str, str]], *, role: str
    ) -> tuple[str, str]:
        """(reply text, model name) of one call, recorded or made now.

        Args:
            purpose: ``generate``, ``judge`` or ``label``.
            candidate: The item the call is for.
            config: Endpoint and sampling.
            messages: The request's messages.
            role: ``model`` or ``judge``: which endpoint (and API key) to use.

        Raises:
            CallFailed: The call failed for good (non-retryable, or retryable on the last attempt).
        """
        endpoint, default_url = self.endpoints[role]
        body = chat_body(config, messages)
        key = f"{self.prefix}/{self.key(purpose, candidate, body)}.json"
        # A first attempt has nothing recorded yet (a key names one candidate of one batch): only
        # a retried batch looks, which saves a storage read per call on the common path.
        completion = await self._recorded(key) if self.retried else None
        if completion is None:
            async with self._slots:
                try:
                    completion = await endpoint.complete(
                        config.base_url or default_url, body, timeout_s=config.request_timeout_s
                    )
                except ApplicationError as exc:
                    reason = f"{role}_error" if not exc.non_retryable else f"{role}_rejected"
                    if not exc.non_retryable and not self.final_attempt:
                        self.pending_error = self.pending_error or exc
                    raise CallFailed(reason, exc.message) from None
                self.made += 1
                request = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
                record = {"stored_at": time.time(), "request_sha256": request, "completion": completion}
                await self.store.put(key, json.dumps(record).encode())
        else:
            self.reused += 1
        choice = completion["choices"][0]["message"]
        content = choice.get("content")
        return (content if isinstance(content, str) else ""), str(completion.get("model") or config.model or role)

    async def _recorded(self, key: str) -> dict[str, Any] | None:
        try:
            data = await self.store.get(self.store.uri(key))
        except StorageError:
            return None
        try:
            completion = json.loads(data)["completion"]
        except (ValueError, KeyError, TypeError):
            return None  # a torn record (cannot happen with atomic puts): ask again
        return completion if isinstance(completion, dict) else None


def endpoints(
    *, model_api_key: str | None, judge_api_key: str | None, http: Any = None
) -> tuple[ChatEndpoint, ChatEndpoint]:
    """The generation and judge endpoints (one aiohttp session each, owned)."""
    return (
        ChatEndpoint(errors=MODEL_ENDPOINT, api_key=model_api_key, http=http),
        ChatEndpoint(errors=JUDGE_ENDPOINT, api_key=judge_api_key, http=http),
    )
