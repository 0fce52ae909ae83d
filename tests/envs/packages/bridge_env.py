"""A plain env (benchmax's shape, sync and async mixed) that misbehaves the ways env code does: it
prints to stdout, raises from a tool, and starts a server in a session of its own that it never stops."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


class LeakyEnv:
    """Tools that print, raise and leak; a reward that counts the calls."""

    system_prompt = "Misbehave."

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def list_tools(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "description": name, "input_schema": {"type": "object"}}
            for name in ("shout", "boom", "spawn")
        ]

    async def init_rollout(self, rollout_id: str, **args: Any) -> None:
        if "bad" in args:
            raise TypeError("init_rollout() got an unexpected keyword argument 'bad'")
        self.calls[rollout_id] = 0

    def run_tool(self, rollout_id: str, tool_name: str, **tool_args: Any) -> Any:
        self.calls[rollout_id] += 1
        if tool_name == "shout":
            print("printed to stdout by the env")  # must not reach the MCP channel
            sys.stdout.flush()
            return {"said": tool_args.get("text", "")}
        if tool_name == "boom":
            raise RuntimeError("the tool broke")
        server = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a server it forgets
        return str(server.pid)

    async def compute_reward(
        self, rollout_id: str, completion: str, ground_truth: Any, **kwargs: Any
    ) -> dict[str, float]:
        return {"calls": float(self.calls[rollout_id]), "echo": float(completion == ground_truth)}
