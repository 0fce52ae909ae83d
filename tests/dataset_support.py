"""A scripted OpenAI-compatible model for dataset generation tests: real HTTP, good / bad /
garbage / hanging replies, and a log of every request it received.

Generation requests are answered by running the offline generator on the passages of the
request (a good reply), or with a question that breaks a guard (bad), or text that is not JSON
(garbage), or nothing for a long time (hang); the judge says "supported" exactly when the answer
is in the passages; trace labels get a score. Which reply a request gets is a function of its
body, so a repeated request gets the same one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymflow.envs.datagen.corpus import Chunk
from gymflow.envs.datagen.filters import answer_in
from gymflow.envs.datagen.generate import GENERATION_SYSTEM, JUDGE_SYSTEM, Candidate, Draft, offline_draft
from gymflow.workers.servers.policy import AppServer

_PASSAGE_RE = re.compile(r'<passage (?:n="\d+" )?id="([^"]+)">\n(.*?)\n</passage>', re.DOTALL)
_TYPE_RE = re.compile(r"<type>(\w+)</type>")
_VARIANT_RE = re.compile(r"<variant>(\d+)</variant>")
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

Outcome = str  # good | bad | garbage | hang | error


def _find(pattern: re.Pattern[str], text: str, default: str) -> str:
    match = pattern.search(text)
    return match.group(1) if match else default


def body_key(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def by_share(**shares: float) -> Callable[[str, str], Outcome]:
    """Outcome by the body hash: e.g. by_share(good=0.7, bad=0.1, garbage=0.2)."""

    def decide(purpose: str, key: str) -> Outcome:
        del purpose
        point = int(key[:8], 16) / 0xFFFFFFFF
        total = 0.0
        for outcome, share in shares.items():
            total += share
            if point < total:
                return outcome
        return "good"

    return decide


@dataclass
class ScriptedModel:
    """The app's behaviour and its request log."""

    decide: Callable[[str, str], Outcome] = field(default_factory=lambda: by_share(good=1.0))
    judge_decide: Callable[[str, str], Outcome] = field(default_factory=lambda: by_share(good=1.0))
    hang_s: float = 30.0
    delay_s: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)
    """One entry per request: key, purpose, received (Unix s), answered (Unix s or None), outcome."""

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])

    async def _complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        key = body_key(body)
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        purpose = "generate" if system == GENERATION_SYSTEM else "judge" if system == JUDGE_SYSTEM else "label"
        outcome = (self.judge_decide if purpose != "generate" else self.decide)(purpose, key)
        entry = {"key": key, "purpose": purpose, "received": time.time(), "answered": None, "outcome": outcome}
        self.log.append(entry)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if outcome == "hang":
            await asyncio.sleep(self.hang_s)
        if outcome == "error":
            return JSONResponse({"error": {"message": "scripted overload", "code": 503}}, status_code=503)
        text = self._reply(purpose, outcome, user)
        entry["answered"] = time.time()
        message = {"role": "assistant", "content": text}
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "scripted",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": len(text) // 4},
            }
        )

    def _reply(self, purpose: str, outcome: Outcome, user: str) -> str:
        if outcome == "garbage":
            return "Sure! Here is something <<not json>> {{{ question: ??"
        passages = [(cid, text) for cid, text in _PASSAGE_RE.findall(user)]
        if purpose == "label":
            return json.dumps({"score": 0.75, "reason": "helpful"})
        if purpose == "judge":
            answer = _find(_ANSWER_RE, user, "")
            supported = any(answer_in(text, answer) for _, text in passages)
            return json.dumps({"reason": "checked", "supported": supported})
        if outcome == "bad":
            return json.dumps({"question": "According to the text, what is described here?", "answer": "nothing"})
        draft = self._draft(user, passages)
        if draft is None:
            return json.dumps({"question": "What?", "answer": "unknown"})
        return "Here you go:\n```json\n" + json.dumps({"question": draft.question, "answer": draft.answer}) + "\n```"

    def _draft(self, user: str, passages: list[tuple[str, str]]) -> Draft | None:
        kind = _find(_TYPE_RE, user, "extractive")
        variant = int(_find(_VARIANT_RE, user, "0"))
        chunks = []
        for cid, text in passages:
            first, _, rest = text.partition("\n")
            heading = first if rest and not first.rstrip().endswith(".") else ""
            doc = cid.split("#")[0]
            chunks.append(Chunk(id=cid, doc_id=doc, index=0, heading=heading, text=text, char_start=0))
        candidate = Candidate(
            id=body_key(user), type=kind, chunk_ids=[c.id for c in chunks],  # type: ignore[arg-type]
            doc_ids=[c.doc_id for c in chunks], split="train", variant=variant,
        )  # fmt: skip
        draft = offline_draft(candidate, chunks)
        return draft if isinstance(draft, Draft) else None

    def completed_at(self) -> dict[str, list[float]]:
        """Key -> times the request was received, for every request."""
        out: dict[str, list[float]] = {}
        for entry in self.log:
            out.setdefault(entry["key"], []).append(entry["received"])
        return out


class ScriptedServer(AppServer):
    def __init__(self, model: ScriptedModel) -> None:
        super().__init__(model.app())
        self.model = model
