"""A policy server for a transformers model: OpenAI Chat Completions over the weights a trainer holds.

`HFPolicyServer` serves causal LMs (`transformers` models, looked up by the request's ``model``)
at ``/v1/chat/completions`` so a gymflow rollout plays them like any endpoint:

* The prompt is the tokenizer's own chat template (``apply_chat_template(...,
  add_generation_prompt=True)``); gymflow renders tools in the hermes format
  (``ModelConfig(tool_format="hermes")``), so a tool call is the model's own ``<tool_call>`` text.
* Token data comes in vLLM's shape (top-level ``prompt_token_ids``, ``choices[0].token_ids``,
  ``choices[0].logprobs.content``), which gymflow's token mode reads (``ModelConfig(tokens="vllm")``).
  A logprob is the log-softmax of the raw logits at the request's temperature: what a trainer
  recomputes from the same weights (TRL divides its logits by the same temperature).
* Nothing is re-tokenised. A request whose prompt text extends a conversation this server answered
  reuses the ids it saw and sampled (`PrefixTokens`) and tokenises only what is new, so each turn's
  prompt extends the previous prompt + completion token for token: text that decodes and encodes
  to other ids (BPE merges across a turn boundary) never enters the training data.
* Requests that arrive together are generated together: one left-padded ``generate`` call per
  batch (up to ``max_batch`` requests, gathered for ``batch_window_s``), grouped by sampling settings.
* The models are the caller's objects, not copies: a trainer's optimizer steps are what the next
  request samples from. Generation runs in one thread of its own, under ``torch.inference_mode``.

``torch`` and ``transformers`` are imported by this module: it runs in a trainer's venv, never in
gymflow's own install.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymflow.workers.servers.policy import AppServer

Resolve = Callable[[str], Any]
"""The model a request names (`None`: the server answers 404): a `transformers` causal LM."""
DEFAULT_MAX_TOKENS = 256


class PrefixTokens:
    """The token ids behind text this server has seen, so a conversation is never re-tokenised.

    `remember(text, ids)` records a prompt + completion as sampled; `ids(text)` is the ids of the
    longest remembered text that `text` starts with, followed by the tokenisation of the rest.
    Least recently used entries go first beyond `capacity`.
    """

    def __init__(self, tokenize: Callable[[str], list[int]], *, capacity: int = 8192) -> None:
        self._tokenize = tokenize
        self._capacity = capacity
        self._entries: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self.hits = 0
        """Prompts that extended a remembered conversation."""

    def ids(self, text: str) -> list[int]:
        best = max((known for known in self._entries if text.startswith(known)), key=len, default=None)
        if best is None:
            return self._tokenize(text)
        self._entries.move_to_end(best)
        self.hits += 1
        rest = text[len(best) :]
        return [*self._entries[best], *(self._tokenize(rest) if rest else [])]

    def remember(self, text: str, ids: list[int]) -> None:
        self._entries[text] = ids
        self._entries.move_to_end(text)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)


@dataclass
class _Request:
    model: Any
    prompt_ids: list[int]
    prompt_text: str
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    done: asyncio.Future[tuple[list[int], list[float], str]] = field(repr=False)

    @property
    def sampling(self) -> tuple[int, float, float]:
        return (id(self.model), self.temperature, self.top_p)


class HFPolicyServer(AppServer):
    """Causal LMs behind the OpenAI chat wire, with token data (see the module docstring).

    Args:
        tokenizer: The tokenizer with the chat template every model served here uses.
        resolve: The model a request's ``model`` names, or None (404). Called for every request.
        max_batch: Requests generated together at most.
        batch_window_s: How long a batch waits for more requests after its first.
        max_context_tokens: Prompts longer than this get vLLM's 400 "maximum context length".
        names: The model names `/v1/models` lists.
    """

    def __init__(
        self,
        tokenizer: Any,
        resolve: Resolve,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = 64,
        batch_window_s: float = 0.01,
        max_context_tokens: int | None = None,
        names: Callable[[], list[str]] = list,
    ) -> None:
        self.tokenizer = tokenizer
        self.resolve = resolve
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_context_tokens = max_context_tokens
        self.prefixes = PrefixTokens(lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        self.batches: list[int] = []
        """The size of every generate call, in order (tests and figures read it)."""
        self._queue: asyncio.Queue[_Request] = asyncio.Queue()
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-generate")
        self._batcher: asyncio.Task[None] | None = None
        self._names = names
        super().__init__(self._routes(), host=host, port=port)

    async def start(self) -> None:
        self._batcher = asyncio.create_task(self._batch_loop(), name="hf-policy-batcher")
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._batcher is not None:
            self._batcher.cancel()
            await asyncio.gather(self._batcher, return_exceptions=True)
            self._batcher = None
        self._thread.shutdown(wait=True)

    def _routes(self) -> Starlette:
        async def models(request: Request) -> JSONResponse:
            del request
            data = [{"id": name, "object": "model", "created": 0, "owned_by": "gymflow"} for name in self._names()]
            return JSONResponse({"object": "list", "data": data})

        return Starlette(
            routes=[
                Route("/v1/models", models, methods=["GET"]),
                Route("/v1/chat/completions", self._completions, methods=["POST"]),
            ]
        )

    async def _completions(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
            max_tokens, temperature, top_p, stop = _sampling(body)
            text = self.tokenizer.apply_chat_template(
                body["messages"], tools=body.get("tools") or None, tokenize=False, add_generation_prompt=True
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return _error(400, f"not a chat completions request this server can render: {exc}")
        name = str(body.get("model") or "")
        model = self.resolve(name)
        if model is None:
            return _error(404, f"The model `{name}` does not exist.")
        prompt_ids = self.prefixes.ids(text)
        if self.max_context_tokens is not None and len(prompt_ids) + max_tokens > self.max_context_tokens:
            return _error(
                400,
                f"This model's maximum context length is {self.max_context_tokens} tokens. However, you "
                f"requested {len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, "
                f"{max_tokens} in the completion).",
            )
        done: asyncio.Future[tuple[list[int], list[float], str]] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(model, prompt_ids, text, max_tokens, temperature, top_p, stop, done))
        ids, logprobs, finish = await done
        completion_text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        self.prefixes.remember(text + completion_text, [*prompt_ids, *ids])
        content = self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        entries: list[dict[str, Any]] = [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(ids, logprobs, strict=True)
        ]
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": name, "prompt_token_ids": prompt_ids,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "token_ids": ids, "logprobs": {"content": entries}, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                      "total_tokens": len(prompt_ids) + len(ids)},
        })  # fmt: skip

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        waiting: list[_Request] = []
        while True:
            if not waiting:
                waiting.append(await self._queue.get())
            deadline = loop.time() + self.batch_window_s
            while len(waiting) < self.max_batch and (left := deadline - loop.time()) > 0:
                try:
                    waiting.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
            key = waiting[0].sampling
            batch = [r for r in waiting if r.sampling == key][: self.max_batch]
            waiting = [r for r in waiting if r not in batch]
            self.batches.append(len(batch))
            try:
                results = await loop.run_in_executor(self._thread, self._generate, batch)
            except Exception as exc:  # a generate that failed fails its requests (500), not the server
                for r in batch:
                    if not r.done.done():
                        r.done.set_exception(exc)
                continue
            for r, result in zip(batch, results, strict=True):
                if not r.done.done():
                    r.done.set_result(result)

    def _generate(self, batch: Sequence[_Request]) -> list[tuple[list[int], list[float], str]]:
        """One generate call for `batch` (same model and sampling settings), in the generation thread."""
        model, first = batch[0].model, batch[0]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(r.prompt_ids) for r in batch)
        device = next(model.parameters()).device
        input_ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch], device=device)
        attention = torch.tensor(
            [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch], device=device
        )
        sample = first.temperature > 0
        options: dict[str, Any] = {"do_sample": sample, "max_new_tokens": max(r.max_tokens for r in batch)}
        if sample:
            options.update(temperature=first.temperature, top_p=first.top_p, top_k=0)
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_logits=True,
                **options,
            )
        generated = out.sequences[:, width:].tolist()
        scale = first.temperature if sample else 1.0
        logits = torch.stack(out.logits, dim=1).float() / scale  # [batch, steps, vocab], raw logits
        chosen = torch.log_softmax(logits, dim=-1).gather(-1, out.sequences[:, width:, None].to(logits.device))
        logprobs = chosen[..., 0].tolist()
        eos = _eos_ids(model, self.tokenizer)
        return [self._cut(r, ids, lps, eos) for r, ids, lps in zip(batch, generated, logprobs, strict=True)]

    def _cut(
        self, r: _Request, ids: list[int], logprobs: list[float], eos: set[int]
    ) -> tuple[list[int], list[float], str]:
        """A row's completion: up to and with its first end-of-sequence token, its stop string, or `max_tokens`."""
        n, finish = min(len(ids), r.max_tokens), "length"
        for i, token in enumerate(ids[:n]):
            if token in eos:
                n, finish = i + 1, "stop"
                break
        if r.stop:
            for i in range(1, n + 1):
                text = self.tokenizer.decode(ids[:i], skip_special_tokens=True)
                if any(s in text for s in r.stop):
                    n, finish = i, "stop"
                    break
        return ids[:n], logprobs[:n], finish


def _sampling(body: Any) -> tuple[int, float, float, list[str]]:
    """(max_tokens, temperature, top_p, stop) of a request.

    Raises:
        ValueError: Something is missing or out of range.
    """
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS)
    temperature = float(1.0 if body.get("temperature") is None else body["temperature"])
    top_p = float(1.0 if body.get("top_p") is None else body["top_p"])
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    if max_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
        raise ValueError("max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1")
    return max_tokens, temperature, top_p, stop


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": status}}, status)
