"""What the chaos tests (tests/chaos) share: real worker processes, a counting env whose server
logs every execution outside the rollout, a policy for it, and readers of the evidence.

* `Fleet` runs `gymflow worker` processes exactly as deploy's local backend does (the task YAML's
  `run` script, one per rank, node id `<host>-<rank>`), and kills (-9) or restarts single ranks.
* The counting env is an env file (so worker processes load it by path): a replayable counter
  whose server appends `{"tag", "by", "value", "pid"}` to a JSONL file for every increment —
  outside every workspace, so it survives the rollout, its server and its worker.
* `CountingPolicy` increments by the steps the task's prompt lists, tagging each call
  `<task id>/<step>`, then answers the sum; the reward reads the live counter.
* `call_ledger` reads a rollout's history: for every tool call, how often it was scheduled as
  itself or as a replay, and whether it completed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from mcp_support import ROOT
from temporalio.api.common.v1 import Payload
from temporalio.client import Client

from gymflow.deploy import launcher
from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.mcp.ledger import start_time
from gymflow.envs.policy import Policy
from support import COUNTER_SERVER

REWARD_FILE = Path(__file__).parent / "chaos" / "counter_reward.py"
_PROMPT_RE = re.compile(r"^count (?P<task>\S+) by (?P<steps>[-\d,]+)$")


def counting_env_file(directory: Path, log: Path, *, tool_timeout_s: float = 10) -> Path:
    """An env file for a replayable counter that logs every increment to `log`."""
    config = {
        "mcpServers": {
            "counter": {
                "command": "python",
                "args": [str(COUNTER_SERVER)],
                "env": {"COUNTER_LOG": str(log)},
                "tool_timeout_s": tool_timeout_s,
            }
        },
        "system_prompt": "Increment the counter by each step, then answer its value.",
        "reward": f"{REWARD_FILE}:counter_matches",
        "replayable": True,
    }
    path = directory / "counting.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def counting_tasks(n: int, steps: int = 3, *, prefix: str = "count") -> list[Task]:
    """`n` tasks; task i increments by i+1, i+2, ... (`steps` calls) and expects the sum."""
    tasks = []
    for i in range(n):
        by = [i % 7 + 1 + k for k in range(steps)]
        task_id = f"{prefix}-{i}"
        tasks.append(Task(id=task_id, prompt=f"count {task_id} by {','.join(map(str, by))}", ground_truth=str(sum(by))))
    return tasks


class CountingPolicy(Policy):
    """Plays a counting task: one tagged increment per turn, then the sum as the answer."""

    name = "counting"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        prompt = next(m.content for m in messages if m.role == "user")
        match = _PROMPT_RE.match(prompt)
        assert match, prompt
        steps = [int(s) for s in match["steps"].split(",")]
        done = sum(m.role == "assistant" for m in messages)
        if done < len(steps):
            tag = f"{match['task']}/{done}"
            return Message(
                role="assistant",
                tool_calls=[ToolCall(id=f"c{done}", name="increment", arguments={"by": steps[done], "tag": tag})],
            )
        return Message(role="assistant", content=str(sum(steps)))


def executions(log: Path) -> Counter[str]:
    """Server-side executions per call tag."""
    if not log.is_file():
        return Counter()
    return Counter(json.loads(line)["tag"] for line in log.read_text().splitlines() if line.strip())


# -- real worker processes ----------------------------------------------------------------------
@dataclass
class Fleet:
    """`gymflow worker` processes started the way `gymflow deploy workers --backend local` does."""

    spec: launcher.FleetSpec
    data_dir: Path
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    kills: list[tuple[int, datetime]] = field(default_factory=list)
    """(rank, wall-clock time) of every kill -9."""

    def start(self, rank: int) -> int:
        """Start (or restart) worker `rank`; returns its pid."""
        config = launcher.task_config(self.spec)
        env = {
            **os.environ,
            **{k: str(v) for k, v in (config.get("envs") or {}).items()},
            "PATH": os.pathsep.join([str(Path(os.sys.executable).parent), os.environ.get("PATH", "")]),
            "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NUM_NODES": str(self.spec.nodes),
        }
        log = (self.data_dir / f"rank-{rank}.log").open("ab")
        self.processes[rank] = subprocess.Popen(
            ["bash", "-c", config["run"]], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        return self.processes[rank].pid

    def kill(self, rank: int) -> None:
        """kill -9 worker `rank` (only the worker: its MCP servers are orphaned, as in a real crash)."""
        process = self.processes[rank]
        self.kills.append((rank, datetime.now().astimezone()))
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM every worker (graceful), SIGKILL what is left after a deadline."""
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + launcher.STOP_TIMEOUT_S
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)

    def alive(self, rank: int) -> bool:
        process = self.processes[rank]
        return process.poll() is None and start_time(process.pid) is not None


def fleet_spec(tmp_path: Path, address: str, queue: str, nodes: int = 2) -> launcher.FleetSpec:
    """A local fleet of `nodes` worker processes on `queue`, with their files under `tmp_path`."""
    return launcher.FleetSpec(
        nodes=nodes,
        temporal_address=address,
        task_queue=queue,
        env={"GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "ws"), "GYMFLOW_DATA_DIR": str(tmp_path / "data")},
    )


@contextlib.contextmanager
def fleet(spec: launcher.FleetSpec, data_dir: Path) -> Iterator[Fleet]:
    running = Fleet(spec, data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        for rank in range(spec.nodes):
            running.start(rank)
        yield running
    finally:
        running.stop()


# -- evidence from histories --------------------------------------------------------------------
@dataclass
class CallRecord:
    """One tool call of a rollout, as its history tells it."""

    tag: str
    scheduled: int = 0
    """Times scheduled as itself (more than once: re-run after its node was lost mid-call)."""
    completed: int = 0
    replays_scheduled: int = 0
    """Times scheduled as a replay on a fresh server after a recovery."""
    replays_completed: int = 0
    first_completed: bool = False
    """Whether the call's first scheduling completed (its result was recorded before any crash)."""


@dataclass
class RolloutLedger:
    """What a rollout's history says about its tool calls and recoveries."""

    calls: dict[str, CallRecord] = field(default_factory=dict)
    recovered_at: list[datetime] = field(default_factory=list)
    """When each recovery's init_rollout completed."""


def _decode(payload: Payload) -> Any:
    return json.loads(payload.data) if payload.metadata.get("encoding") == b"json/plain" else None


async def call_ledger(client: Client, workflow_id: str) -> RolloutLedger:
    """Read `workflow_id`'s history (all its runs are one here: rollouts do not continue as new)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    ledger = RolloutLedger()
    scheduled: dict[int, tuple[str, str, bool]] = {}  # event id -> (activity, tag, replay?)
    first_seen: set[str] = set()
    first_ids: dict[int, str] = {}
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            kind = attrs.activity_type.name
            summary = _decode(event.user_metadata.summary) if event.HasField("user_metadata") else ""
            tag = ""
            if kind == "call_tool":
                tag = _decode(attrs.input.payloads[0])["call"]["arguments"]["tag"]
                replay = str(summary).startswith("replay ")
                record = ledger.calls.setdefault(tag, CallRecord(tag))
                if replay:
                    record.replays_scheduled += 1
                else:
                    record.scheduled += 1
                    if tag not in first_seen:
                        first_seen.add(tag)
                        first_ids[event.event_id] = tag
                scheduled[event.event_id] = (kind, tag, replay)
            elif kind == "init_rollout":
                scheduled[event.event_id] = (kind, "recovery" if "(recovery" in str(summary) else "", False)
        elif event.HasField("activity_task_completed_event_attributes"):
            sid = event.activity_task_completed_event_attributes.scheduled_event_id
            kind, tag, replay = scheduled.get(sid, ("", "", False))
            if kind == "call_tool":
                record = ledger.calls[tag]
                if replay:
                    record.replays_completed += 1
                else:
                    record.completed += 1
                    record.first_completed |= first_ids.get(sid) == tag
            elif kind == "init_rollout" and tag == "recovery":
                ledger.recovered_at.append(event.event_time.ToDatetime().astimezone())
    return ledger


def reexecutions(ledgers: list[RolloutLedger], ran: Counter[str]) -> tuple[int, int, int]:
    """(replay re-executions, in-flight re-executions, calls cut by a kill), checking the rule:
    a call that completed before any crash ran again only as a replay."""
    replayed = in_flight = interrupted = 0
    for ledger in ledgers:
        for tag, record in ledger.calls.items():
            assert ran[tag] >= 1, tag
            interrupted += not record.first_completed
            extra = ran[tag] - 1
            from_replays = min(extra, record.replays_scheduled)
            from_in_flight = extra - from_replays
            if record.first_completed:  # completed before any crash: only replays may run it again
                assert from_in_flight == 0, (tag, ran[tag], record)
            else:  # in flight when its worker died: at most once more per extra scheduling
                assert from_in_flight <= record.scheduled - 1 + record.replays_scheduled - from_replays, (tag, record)
            replayed += from_replays
            in_flight += from_in_flight
    return replayed, in_flight, interrupted
