"""A small file-writing agent written with the official `openai` client, as a user would write it.

It reads its task from GYMFLOW_PROMPT and its endpoint from OPENAI_BASE_URL / OPENAI_API_KEY (the
client's own variables), offers the model one tool, `write_file`, and loops until the model answers
without calling it. `--api` picks Chat Completions (plain or streamed) or the Responses API (plain,
streamed, or chained with previous_response_id). It knows nothing of gymflow.

    python openai_agent.py --api chat|chat-stream|responses|responses-stream|responses-chain
    python openai_agent.py --malformed     # send a request the API refuses; print the error, exit 3
    python openai_agent.py --pause 2       # think for 2 s after each tool call (chaos tests kill then)
    python openai_agent.py --rewrite       # rewrite its system prompt before every call (history changes)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import openai

TOOL = {
    "name": "write_file",
    "description": "Write text to a file in the working directory.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}


PAUSE = {"seconds": 0.0}
REWRITE = {"on": False}


def write_file(path: str, content: str) -> str:
    Path(path).write_text(content)
    time.sleep(PAUSE["seconds"])
    return f"wrote {len(content)} characters to {path}"


# --8<-- [start:chat]
def chat(client: openai.OpenAI, prompt: str, stream: bool) -> str:
    messages: list[dict] = [{"role": "system", "content": "You write files."}, {"role": "user", "content": prompt}]
    for call_number in range(8):
        if REWRITE["on"]:
            messages[0] = {"role": "system", "content": f"You write files. This is call {call_number + 1}."}
        if stream:
            text, calls, finish = "", {}, None
            for chunk in client.chat.completions.create(
                model="any",
                messages=messages,
                tools=[{"type": "function", "function": TOOL}],
                stream=True,
                stream_options={"include_usage": True},
            ):
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                text += delta.content or ""
                for call in delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += call.id or ""
                    slot["name"] += (call.function.name or "") if call.function else ""
                    slot["arguments"] += (call.function.arguments or "") if call.function else ""
                finish = chunk.choices[0].finish_reason or finish
            tool_calls = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(calls.items())
            ]
        else:
            reply = client.chat.completions.create(
                model="any", messages=messages, tools=[{"type": "function", "function": TOOL}]
            )
            message = reply.choices[0].message
            text = message.content or ""
            tool_calls = [c.model_dump() for c in message.tool_calls or []]
        messages.append(
            {"role": "assistant", "content": text or None, **({"tool_calls": tool_calls} if tool_calls else {})}
        )
        if not tool_calls:
            return text
        for call in tool_calls:
            result = write_file(**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return "gave up"


# --8<-- [end:chat]


def responses(client: openai.OpenAI, prompt: str, stream: bool, chain: bool) -> str:
    tools = [{"type": "function", **TOOL}]
    items: list = [{"role": "user", "content": prompt}]
    previous = None
    for _ in range(8):
        kwargs = {"model": "any", "instructions": "You write files.", "tools": tools}
        if chain and previous is not None:
            kwargs["previous_response_id"] = previous
        if stream:
            response = None
            for event in client.responses.create(input=items, stream=True, **kwargs):
                if event.type == "response.completed":
                    response = event.response
            assert response is not None, "the stream ended without response.completed"
        else:
            response = client.responses.create(input=items, **kwargs)
        previous = response.id
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": write_file(**json.loads(c.arguments))}
            for c in calls
        ]
        if chain:
            items = outputs
        else:
            items += [c.model_dump(exclude_none=True) for c in calls] + outputs
    return "gave up"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", default="chat")
    parser.add_argument("--malformed", action="store_true")
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--rewrite", action="store_true")
    args = parser.parse_args()
    PAUSE["seconds"] = args.pause
    REWRITE["on"] = args.rewrite
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    if args.malformed:
        try:
            client.chat.completions.create(model="any", messages=[])
        except openai.APIStatusError as exc:
            print(json.dumps({"status": exc.status_code, "body": exc.body}))
            return 3
        return 0
    prompt = os.environ["GYMFLOW_PROMPT"]
    if args.api.startswith("chat"):
        answer = chat(client, prompt, stream=args.api == "chat-stream")
    else:
        answer = responses(client, prompt, stream=args.api == "responses-stream", chain=args.api == "responses-chain")
    print(f"answer: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
