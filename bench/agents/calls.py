"""A program that makes N chat calls with the official openai client and prints each call's latency.

The harness benchmark (bench/harness.py) runs it twice the same way: pointed at the model directly,
and as a harness rollout's program pointed at the gateway. Its endpoint comes from OPENAI_BASE_URL /
OPENAI_API_KEY; it prints one JSON line {"latencies_ms": [...]} at the end.
"""

from __future__ import annotations

import json
import sys
import time

import openai


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    client = openai.OpenAI(max_retries=0)
    messages = [{"role": "system", "content": "Answer briefly."}]
    latencies = []
    for index in range(calls):
        messages.append({"role": "user", "content": f"call {index}: say ok"})
        started = time.perf_counter()
        reply = client.chat.completions.create(model="any", messages=messages)
        latencies.append((time.perf_counter() - started) * 1000)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    print(json.dumps({"latencies_ms": [round(v, 3) for v in latencies]}))


if __name__ == "__main__":
    main()
