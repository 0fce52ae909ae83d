"""The transformers policy server's answers to good and bad requests, in the trainer venv; JSON out.

    .venv-trl/bin/python tests/workers/hf_policy_check.py OUT.json

Serves the tiny model (gymflow.workers.trainers.models) with HFPolicyServer and records what real HTTP
requests get back: bad bodies, an unknown model, out-of-range settings, a prompt over the context;
four concurrent requests (one generate call); a second turn that extends the first token for token;
the sampler's logprobs against a forward pass of the same weights.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any


async def check() -> dict[str, Any]:
    import httpx
    import torch

    from gymflow.workers.servers.hf_policy import HFPolicyServer
    from gymflow.workers.trainers.models import load_model

    model, tokenizer = load_model("tiny")
    out: dict[str, Any] = {}
    resolve = {"policy": model}.get
    server = HFPolicyServer(
        tokenizer, resolve, max_context_tokens=200, batch_window_s=0.5, names=lambda: ["policy"]
    )  # a wide window: four requests sent at once land in one batch even on a loaded box
    async with server, httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2 + 3?"}]

        async def post(body: Any) -> tuple[int, Any]:
            response = await http.post("/chat/completions", content=json.dumps(body))
            return response.status_code, response.json()

        out["bad"] = {
            "not_json": (await http.post("/chat/completions", content=b"{")).status_code,
            "no_messages": (await post({"model": "policy"}))[0],
            "empty_messages": (await post({"model": "policy", "messages": []}))[0],
            "max_tokens_0": (await post({"model": "policy", "messages": messages, "max_tokens": 0}))[0],
            "negative_temperature": (await post({"model": "policy", "messages": messages, "temperature": -1}))[0],
            "unknown_model": (await post({"model": "nope", "messages": messages}))[0],
            "over_context": await post({"model": "policy", "messages": messages * 20, "max_tokens": 8}),
        }
        out["models"] = (await http.get("/models")).json()
        body = {"model": "policy", "messages": messages, "max_tokens": 10, "temperature": 1.0}
        answers = await asyncio.gather(*(post(body) for _ in range(4)))
        out["batches"] = list(server.batches)
        out["statuses"] = [status for status, _ in answers]
        first = answers[0][1]
        choice = first["choices"][0]
        again = [*messages, {"role": "assistant", "content": choice["message"]["content"]},
                 {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}]  # fmt: skip
        status, second = await post({"model": "policy", "messages": again, "max_tokens": 5})
        seen = first["prompt_token_ids"] + choice["token_ids"]
        out["extends"] = status == 200 and second["prompt_token_ids"][: len(seen)] == seen
        ids = torch.tensor([seen])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(first["prompt_token_ids"]) - 1 : -1].float()
        mine = torch.log_softmax(logits, -1).gather(-1, ids[0, len(first["prompt_token_ids"]) :, None])[:, 0]
        sampled = torch.tensor([e["logprob"] for e in choice["logprobs"]["content"]])
        out["logprob_diff_max"] = float((mine - sampled).abs().max())
        out["finish_reason"] = choice["finish_reason"]
        out["usage"] = first["usage"]
        out["token_ids"] = choice["token_ids"]
    return out


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(asyncio.run(check())))
