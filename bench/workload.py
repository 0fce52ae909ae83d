"""The benchmark workload: one env, one policy and one model endpoint shared by every runner.

Direct (plain asyncio), gymflow and the bare-Temporal ceiling all play the same rollout: the
policy calls the `step` tool `n` times, one call per turn, then answers. What the rollout costs
besides orchestration is set per task, so one worker and one endpoint serve every scenario:

* tool latency: `Task.init_args["tool_delay_s"]` (the env sleeps that long in every tool call);
* model latency: the endpoint's path, `http://HOST:PORT/delay/<ms>/v1` (`LatencyMiddleware`
  sleeps that long before answering).

`python -m bench.workload --port P` serves the policy (uvicorn, one process) with
`GET /bench/stats` counting requests and the distinct TCP connections they came over, which is
how the benchmark checks that model calls reuse connections.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from gymflow.envs.contract import BaseEnv, Message, Reward, Task, ToolCall, ToolResult, ToolSpec
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.policy import Policy
from gymflow.envs.registry import register
from gymflow.workers.servers.policy import build_app

ENV_NAME = "bench-tools"
_STEPS_RE = re.compile(r"call step (\d+) times")
_DELAY_RE = re.compile(r"^/delay/(\d+)(/.*)$")


def bench_task(index: int, *, tool_turns: int, tool_delay_s: float = 0.0) -> Task:
    """Task `index` of a scenario: `tool_turns` tool turns, each tool call taking `tool_delay_s`."""
    return Task(
        id=f"bench-{index}",
        prompt=f"Benchmark rollout: call step {tool_turns} times, then answer with the count.",
        ground_truth=tool_turns,
        init_args={"tool_delay_s": tool_delay_s},
    )


def endpoint(base: str, model_delay_s: float) -> str:
    """The model URL under `base` (``http://HOST:PORT``) that answers after `model_delay_s`."""
    return f"{base}/delay/{round(model_delay_s * 1000)}/v1"


def counted(completion: list[Message], ground_truth: Any) -> Reward:
    """1 when the last message answers the count of steps, else 0."""
    return Reward(total=float(bool(completion) and f"<answer>{ground_truth}</answer>" in completion[-1].content))


class BenchEnv(BaseEnv):
    """One in-process tool, `step`, answering after the rollout's `tool_delay_s` (no MCP process)."""

    name = ENV_NAME
    system_prompt = "Call the step tool as asked, then answer with <answer>N</answer>."
    stateless = True
    fused_turns = True  # tool calls may re-run: one activity per turn (gymflow.activities.turn)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._delays: dict[str, float] = {}

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        self._delays[rollout_id] = float(rollout_args.get("tool_delay_s", 0.0))

    async def release_rollout(self, rollout_id: str) -> None:
        self._delays.pop(rollout_id, None)

    async def list_tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}
        return [ToolSpec(name="step", description="Take step i.", input_schema=schema)]

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        delay = self._delays.get(rollout_id, 0.0)
        if delay:
            await asyncio.sleep(delay)
        return ToolResult(text=f"step {tool_args['i']} done")

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        return counted(completion, ground_truth)


register(ENV_NAME, BenchEnv)

SHARED_ENV_NAME = "bench-shared-mcp"
STEP_SERVER = Path(__file__).with_name("step_server.py")


class BenchSharedEnv(McpEnv):
    """The same `step` tool from an MCP server, one process per worker for every rollout
    (`shared_servers`): the env of the shared-mode density run (bench.shared_density)."""

    name = SHARED_ENV_NAME
    system_prompt = BenchEnv.system_prompt
    stateless = True
    shared_servers = True
    fused_turns = True
    # One start per worker: no fork server worth keeping.
    mcp_servers = {"step": {"command": "python", "args": [str(STEP_SERVER)], "fork": False}}

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        rollout_args.pop("tool_delay_s", None)  # the server answers at once
        await super().init_rollout(rollout_id, **rollout_args)

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        return counted(completion, ground_truth)


register(SHARED_ENV_NAME, BenchSharedEnv)


class BenchPolicy(Policy):
    """Calls `step` once per turn as many times as the prompt asks, then answers the count."""

    name = "bench"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        prompt = next((m.content for m in messages if m.role == "user"), "")
        match = _STEPS_RE.search(prompt)
        steps = int(match.group(1)) if match else 0
        done = sum(m.role == "assistant" for m in messages)
        if done < steps:
            call = ToolCall(id=f"step-{done}", name="step", arguments={"i": done})
            return Message(role="assistant", tool_calls=[call])
        return Message(role="assistant", content=f"<answer>{steps}</answer>")


class LatencyMiddleware:
    """Serves ``/delay/<ms>/...`` as ``/...`` after sleeping ``ms``; counts requests and connections."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests = 0
        self.connections: set[tuple[str, int]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/bench/stats":
            await self._stats(send, reset=scope["method"] == "POST")
            return
        self.requests += 1
        client = scope.get("client")
        if client:
            self.connections.add((client[0], client[1]))
        match = _DELAY_RE.match(path)
        if match:
            delay_ms, path = int(match.group(1)), match.group(2)
            scope = {**scope, "path": path, "raw_path": path.encode()}
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
        await self.app(scope, receive, send)

    async def _stats(self, send: Send, *, reset: bool) -> None:
        body = f'{{"requests": {self.requests}, "connections": {len(self.connections)}}}'.encode()
        if reset:
            self.requests, self.connections = 0, set()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the benchmark policy with per-path model latency.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = LatencyMiddleware(build_app(BenchPolicy()))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, backlog=4096)


if __name__ == "__main__":
    main()
