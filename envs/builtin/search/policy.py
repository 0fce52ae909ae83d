"""The search env's baseline policy: retrieve, read, extract.

`RetrievePolicy` is a program, not a model: it searches with the question, reads the top
document around the hit, and answers with the span of the best-matching sentence that the
question does not already contain (a year for "what year", a number for "how many", else a
name), citing the document it read. For a two-hop question that quotes a sentence with a blank
(the offline generator's bridge form) it first searches the quoted sentence and fills the blank
from the passage, then asks about that name. It is the floor a trained agent must beat and the
check that the env's tools and rewards work: well above 0 on generated datasets, where the null
policy scores 0.

Like every baseline policy it is stateless: each turn it reads the conversation (its own tool
call ids say which step a result belongs to) and emits the next call or the answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from gymflow.envs.contract import Message, ToolCall, ToolSpec
from gymflow.envs.datagen.generate import CLOZE_PREFIX
from gymflow.envs.datagen.text import answer_spans
from gymflow.envs.policy import Policy

_BRIDGE_RE = re.compile(r'"([^"]*____[^"]*)"\s*That one (.+?) (what year|how many|what)\?', re.DOTALL)
_WORD_RE = re.compile(r"\w+")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "by",
        "to",
        "for",
        "from",
        "and",
        "or",
        "is",
        "was",
        "were",
        "are",
        "be",
        "been",
        "what",
        "which",
        "who",
        "whom",
        "when",
        "where",
        "how",
        "many",
        "year",
        "that",
        "this",
        "one",
        "take",
        "name",
        "fills",
        "blank",
        "with",
        "as",
        "it",
        "its",
    ]
)


def _words(text: str) -> set[str]:
    return {w for w in _WORD_RE.findall(text.casefold()) if w not in _STOP}


def _results(messages: Sequence[Message]) -> list[Any]:
    """Tool results in order (parsed JSON; None for errors or unparseable content). The policy makes
    one call per turn, so the n-th result answers its n-th step, whatever ids a server gave them."""
    out: list[Any] = []
    for message in messages:
        if message.role == "tool":
            try:
                out.append(None if message.is_error else json.loads(message.content))
            except ValueError:
                out.append(None)
    return out


def _call(call_id: str, name: str, **arguments: Any) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, name=name, arguments=arguments)])


def _answer(text: str, doc_id: str | None) -> Message:
    cite = f" <cite>{doc_id}</cite>" if doc_id else ""
    return Message(role="assistant", content=f"<answer>{text}</answer>{cite}")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def extract(question: str, text: str, wh: str) -> str | None:
    """The answer span in `text` for `question` (see the module docstring)."""
    asked = _words(question)
    want = {"what year": "year", "how many": "number"}.get(wh, "name")
    best: tuple[float, str] | None = None
    for sentence in _sentences(text):
        overlap = len(asked & _words(sentence))
        if not overlap:
            continue
        spans = [(s, e, k) for s, e, k in answer_spans(sentence) if not _words(sentence[s:e]) <= asked]
        spans.sort(key=lambda span: span[2] != want)
        if spans and (best is None or overlap > best[0]):
            best = (overlap, sentence[spans[0][0] : spans[0][1]])
    return best[1] if best else None


def _wh(question: str) -> str:
    lowered = question.casefold()
    return "what year" if "what year" in lowered else "how many" if "how many" in lowered else "what"


def _fill_blank(pattern: str, text: str) -> str | None:
    parts = [re.escape(p.strip()) for p in " ".join(pattern.split()).split("____")]
    regex = r"\s*(.+?)\s*".join(parts) + (r"(?=[.,;]|$)" if not parts[-1] else "")
    match = re.search(regex, " ".join(text.split()))
    return match.group(1).strip() if match else None


class RetrievePolicy(Policy):
    """Retrieve-and-extract over the search tools (see the module docstring)."""

    name = "retrieve"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        if not {"search", "read"} <= {t.name for t in tools}:
            return _answer("unknown", None)
        question = next((m.content for m in messages if m.role == "user"), "")
        results = _results(messages)
        bridge = _BRIDGE_RE.search(question)
        query = question
        if bridge:
            if not results:
                return _call("bridge", "search", query=bridge.group(1).replace("____", " "), k=3)
            hits = (results.pop(0) or {}).get("hits", [])
            name = next((n for h in hits if (n := _fill_blank(bridge.group(1), h["text"]))), None)
            if name is None:
                return _answer("unknown", None)
            query = f"{name} {bridge.group(2)}"
        if not results:
            return _call("search", "search", query=query, k=5)
        hits = (results[0] or {}).get("hits", [])
        if not hits:
            return _answer("unknown", None)
        top = hits[0]
        if len(results) < 2:
            return _call("read", "read", doc_id=top["doc_id"], offset=max(top["offset"] - 200, 0), length=1600)
        text = (results[1] or {}).get("text", "") or top["text"]
        cloze = question.startswith(CLOZE_PREFIX) and "____" in question
        if cloze:  # the blanked sentence is a pattern: fill it from what was read
            pattern = question[len(CLOZE_PREFIX) :]
            answer = _fill_blank(pattern, text) or _fill_blank(pattern, top["text"])
        else:
            answer = extract(query, text, _wh(question)) or extract(query, top["text"], _wh(question))
        return _answer(answer or "unknown", top["doc_id"])
