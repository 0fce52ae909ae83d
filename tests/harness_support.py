"""What the harness tests share: a scripted upstream for file-writing tasks, env files, the request log.

* `FileTaskPolicy` plays tasks "write PATH: CONTENT" the way a model would through tests/agents/*:
  one `write_file` call, then a final answer once the tool's result is in the conversation.
* `harness_env_file` writes a harness env file running one of those agents, scored by
  tests/agents/file_reward.py (every file written with its content).
* The upstream is the policy server with `record_requests`: every request it answered, by
  fingerprint, so a test can say that no request was answered twice.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import third_party_agents
import yaml
from temporalio.client import Client

from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.policy import Policy

AGENTS = Path(__file__).parent / "agents"
_LINE_RE = re.compile(r"write (?P<path>[\w.-]+): (?P<content>.*)$")


def agent_python() -> Path:
    """The python of the official clients' venv (skips the test when it is not installed)."""
    python = third_party_agents.executable("clients")
    if not python.exists():
        pytest.skip(f"the openai/anthropic clients are not installed: {third_party_agents.install_command('clients')}")
    return python


def file_task(index: int, *, prefix: str = "note", files: int = 1) -> Task:
    """A task to write `files` files ("write PATH: CONTENT", one line each)."""
    wanted = {f"{prefix}-{index}-{k}.txt": f"line {k} of task {index}" for k in range(files)}
    prompt = "\n".join(f"write {path}: {content}" for path, content in wanted.items())
    return Task(id=f"{prefix}-{index}", prompt=prompt, ground_truth=wanted)


class FileTaskPolicy(Policy):
    """Writes the task's files with the program's `write_file` tool, one per turn, then answers."""

    name = "file-task"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        prompt = next(m.content for m in messages if m.role == "user")
        lines = [m for line in prompt.strip().splitlines() if (m := _LINE_RE.match(line.strip()))]
        if not lines:
            return Message(role="assistant", content="I cannot read this task.")
        done = sum(m.role == "tool" for m in messages)
        if done >= len(lines):
            return Message(role="assistant", content="done: " + ", ".join(m["path"] for m in lines))
        arguments = {"path": lines[done]["path"], "content": lines[done]["content"]}
        return Message(
            role="assistant", tool_calls=[ToolCall(id=f"call_{done}", name="write_file", arguments=arguments)]
        )


def harness_env_file(directory: Path, command: list[str], *, timeout_s: float = 120, **extra: Any) -> Path:
    """A harness env file running `command`, scored by `file_written`."""
    config = {
        "harness": {"command": command, "timeout_s": timeout_s},
        "reward": f"{AGENTS / 'file_reward.py'}:file_written",
        **extra,
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def processes_with(marker: str) -> list[int]:
    """Pids of live processes with `marker` as one of their arguments (zombies excluded)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


async def wait_for(predicate: Callable[[], bool], *, timeout_s: float = 60, what: str = "condition") -> None:
    """Poll `predicate` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(0.05)


SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's way to end a task: a command whose output's first line is this marker."""


class BashFilePolicy(Policy):
    """Plays file tasks through a `bash` tool (mini-swe-agent's): one printf per file, then the submit command."""

    name = "bash-file-task"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        prompt = next(m.content for m in messages if m.role == "user")
        lines = [m for line in prompt.splitlines() if (m := _LINE_RE.search(line.strip()))]
        done = sum(1 for m in messages if m.role == "assistant")
        command = SUBMIT if done >= len(lines) else f"printf '%s' '{lines[done]['content']}' > {lines[done]['path']}"
        call = ToolCall(id=f"call_{done}", name="bash", arguments={"command": command})
        return Message(role="assistant", content=f"Step {done + 1}.", tool_calls=[call])


async def replays(client: Client, workflow_id: str) -> None:
    """Replay a finished rollout's history against today's workflow code (update handlers included)."""
    from temporalio.worker import Replayer

    from gymflow.workers.client import DATA_CONVERTER
    from gymflow.workers.roles import all_workflows
    from gymflow.workers.sandbox_runner import workflow_runner

    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(workflows=all_workflows(), data_converter=DATA_CONVERTER, workflow_runner=workflow_runner())
    await replayer.replay_workflow(history)
