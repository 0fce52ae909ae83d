"""What the harness tests share: a scripted upstream for file-writing tasks, env files, the request log.

* `FileTaskPolicy` plays tasks "write PATH: CONTENT" the way a model would through tests/agents/*:
  one `write_file` call, then a final answer once the tool's result is in the conversation.
* `harness_env_file` writes a harness env file running one of those agents, scored by `file_written`.
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

from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.policy import Policy

AGENTS = Path(__file__).parent / "agents"
_PROMPT_RE = re.compile(r"^write (?P<path>[\w.-]+): (?P<content>.*)$", re.DOTALL)


def agent_python() -> Path:
    """The python of the official clients' venv (skips the test when it is not installed)."""
    python = third_party_agents.executable("clients")
    if not python.exists():
        pytest.skip(f"the openai/anthropic clients are not installed: {third_party_agents.install_command('clients')}")
    return python


def file_task(index: int, *, prefix: str = "note") -> Task:
    path, content = f"{prefix}-{index}.txt", f"line {index} of the harness test"
    return Task(id=f"{prefix}-{index}", prompt=f"write {path}: {content}", ground_truth={"path": path, "content": content})


class FileTaskPolicy(Policy):
    """Writes the task's file with the program's `write_file` tool, then answers."""

    name = "file-task"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        prompt = next(m.content for m in messages if m.role == "user")
        match = _PROMPT_RE.match(prompt.strip())
        if match is None:
            return Message(role="assistant", content="I cannot read this task.")
        if any(m.role == "tool" for m in messages):
            return Message(role="assistant", content=f"done: {match['path']}")
        arguments = {"path": match["path"], "content": match["content"]}
        turn = sum(m.role == "assistant" for m in messages)
        return Message(role="assistant", tool_calls=[ToolCall(id=f"call_{turn}_0", name="write_file", arguments=arguments)])


def file_written(completion: str, ground_truth: Any, workspace: Path, **kwargs: Any) -> float:
    """1.0 when the task's file holds exactly the task's content."""
    del completion, kwargs
    path = workspace / ground_truth["path"]
    return float(path.is_file() and path.read_text() == ground_truth["content"])


def harness_env_file(directory: Path, command: list[str], *, timeout_s: float = 120, **extra: Any) -> Path:
    """A harness env file running `command`, scored by `file_written`."""
    config = {
        "harness": {"command": command, "timeout_s": timeout_s},
        "reward": f"{Path(__file__).resolve()}:file_written",
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
