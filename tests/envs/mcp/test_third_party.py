"""A PyPI MCP server this project did not write (mcp-server-calculator, on mcp 1.x in its own venv)
plugs in by an env file alone and runs real rollouts through `gymflow rollout FILE`, offline."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from mcp_support import ROOT, third_party

from gymflow.envs.contract import Message, ToolSpec
from gymflow.envs.envfile import env_from_file
from gymflow.envs.policy import Policy
from gymflow.workers.servers.policy import PolicyServer
from support import call

REWARD = '''
import re

async def correct(completion, ground_truth, workspace, mcp_client, **kwargs):
    """The <answer> must match the ground truth, re-checked on the rollout's live server."""
    answer = re.search(r"<answer>(.*?)</answer>", completion)
    check = await mcp_client.call_tool("calculate", {"expression": kwargs["metadata"]["expression"]})
    return float(answer is not None and answer.group(1) == str(ground_truth) == check.text)
'''
TASKS = [("6*7", "42"), ("2**10", "1024"), ("(3+4)*5", "35")]


class CalculatePolicy(Policy):
    """Sends the task's expression to `calculate`, then answers with what the tool said."""

    name = "calculate"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        results = [m for m in messages if m.role == "tool"]
        if results:
            return Message(role="assistant", content=f"<answer>{results[-1].content}</answer>")
        expression = re.search(r"Compute (.+)\.$", messages[-1].content)
        assert expression is not None and [t.name for t in tools] == ["calculate"]
        return Message(role="assistant", tool_calls=[call("calculate", {"expression": expression.group(1)})])


def write_env(tmp_path: Path, calculator: Path) -> Path:
    (tmp_path / "reward_fn.py").write_text(REWARD)
    rows = [{"id": f"t{i}", "prompt": f"Compute {e}.", "answer": a, "metadata": {"expression": e}}
            for i, (e, a) in enumerate(TASKS)]  # fmt: skip
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "calculator.yaml"
    path.write_text(
        textwrap.dedent(f"""
        mcpServers:
          calculator:
            command: {calculator}
        system_prompt: Use the calculator. End with <answer>RESULT</answer>.
        reward: reward_fn.py:correct
        dataset: tasks.jsonl
        stateless: true
        """)
    )
    return path


async def test_pypi_server_tools_through_the_env(tmp_path: Path) -> None:
    path = write_env(tmp_path, third_party("calculator"))
    env = env_from_file(path, workspace_root=tmp_path / "ws", pool_size=0)
    try:
        await env.init_rollout("r")
        (spec,) = await env.list_tools()
        assert spec.name == "calculate" and spec.server == "calculator"
        assert (await env.run_tool("r", "calculate", expression="2**0.5*2**0.5")).text.startswith("2.0000")
        error = await env.run_tool("r", "calculate", expression="1/0")
        assert error.is_error and "division by zero" in error.text
    finally:
        await env.shutdown()


async def test_gymflow_rollout_runs_an_env_file_of_a_pypi_server(temporal_address: str, tmp_path: Path) -> None:
    path = write_env(tmp_path, third_party("calculator"))
    async with PolicyServer(CalculatePolicy()) as policy:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gymflow.workers.cli", "rollout", str(path), "--n", "3", "--json",
            "--address", temporal_address, "--task-queue", f"third-party-{os.getpid()}-{id(path)}",
            "--model-url", policy.url,
            cwd=ROOT,
            env={**os.environ, "GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "ws"), "GYMFLOW_DATA_DIR": str(tmp_path)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, stderr.decode()
    report = json.loads(stdout)
    assert report["summary"]["rollouts"] == 3 and report["summary"]["infra_failed"] == 0
    assert sorted((r["task_id"], r["reward"], r["tool_calls"]) for r in report["rollouts"]) == [
        ("t0", 1.0, 1),
        ("t1", 1.0, 1),
        ("t2", 1.0, 1),
    ]
