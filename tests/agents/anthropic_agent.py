"""The same file-writing agent written with the official `anthropic` client (Messages API).

Endpoint and key from ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY (the client's own variables), the task
from GYMFLOW_PROMPT. Knows nothing of gymflow.

    python anthropic_agent.py [--stream]
    python anthropic_agent.py --malformed   # a request the API refuses; print the error, exit 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import anthropic

TOOL = {
    "name": "write_file",
    "description": "Write text to a file in the working directory.",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--malformed", action="store_true")
    args = parser.parse_args()
    client = anthropic.Anthropic()
    if args.malformed:
        try:
            client.messages.create(model="any", max_tokens=0, messages=[{"role": "user", "content": "hi"}])
        except anthropic.APIStatusError as exc:
            print(json.dumps({"status": exc.status_code, "body": exc.body}))
            return 3
        return 0
    messages: list[dict] = [{"role": "user", "content": os.environ["GYMFLOW_PROMPT"]}]
    for _ in range(8):
        request = {
            "model": "any",
            "max_tokens": 512,
            "system": "You write files.",
            "tools": [TOOL],
            "messages": messages,
        }
        if args.stream:
            with client.messages.stream(**request) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**request)
        messages.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            print("answer: " + "".join(block.text for block in reply.content if block.type == "text"))
            return 0
        results = []
        for use in uses:
            Path(use.input["path"]).write_text(use.input["content"])
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": f"wrote {use.input['path']}"})
        messages.append({"role": "user", "content": results})
    return 1


if __name__ == "__main__":
    sys.exit(main())
