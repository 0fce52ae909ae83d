"""Tools that hang forever, in many rollouts at once: each model gets an error observation within
the tool's timeout plus a few seconds, the hung server process is killed, and the rollout goes on
(its state rebuilt on a fresh server) to a correct reward."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from pathlib import Path

import figures
import pytest
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.policy import Policy
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker, running_worker
from support import make_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROLLOUTS = 12
TOOL_TIMEOUT_S = 1.0
"""The `sleep` tool's timeout in the counter envs (tests/support.py)."""
SLACK_S = 5.0


class HangingPolicy(Policy):
    """increment 2, sleep for an hour (hangs), increment 3, answer.

    It also checks the runtime from the outside: before the hanging call it notes the rollout's
    server pid, and when the model gets its next turn (after the error observation) that process
    must already be dead, killed by the tool timeout, not later by the rollout's release.
    """

    name = "hanging"

    def __init__(self, worker: RunningWorker) -> None:
        self.env = worker.env.env("counter-replayable")
        self.hung: dict[str, tuple[int, str | None]] = {}
        """Task -> (pid, start time) of the server that hangs."""
        self.killed_in_time: set[str] = set()

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        assert isinstance(self.env, McpEnv)
        task = next(m.content for m in messages if m.role == "user").rsplit(" ", 1)[1]
        done = sum(m.role == "assistant" for m in messages)
        if done == 1:  # about to hang: note whose server will be stuck
            (key,) = [k for k in self.env.live_rollouts() if k.startswith(f"rollout-{task}-") and k.endswith("#0")]
            pid = self.env.server_pids(key)["counter"] or 0
            self.hung[task] = (pid, started(pid))
        if done == 2 and gone(*self.hung[task]):
            self.killed_in_time.add(task)
        script = [
            ToolCall(id="c0", name="increment", arguments={"by": 2}),
            ToolCall(id="c1", name="sleep", arguments={"seconds": 3600}),
            ToolCall(id="c2", name="increment", arguments={"by": 3}),
        ]
        if done < len(script):
            return Message(role="assistant", tool_calls=[script[done]])
        return Message(role="assistant", content="5")


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, it names one process."""
    fields = stat_fields(pid)
    return fields[19] if fields else None


def gone(pid: int, start: str | None) -> bool:
    """Dead (or a zombie) — a pid can be reused quickly where pid_max is 32768, so a live process
    with another start time is a different process."""
    fields = stat_fields(pid)
    return fields is None or fields[0] == "Z" or fields[19] != start


async def test_hung_tools_become_error_observations_and_rollouts_go_on(client: Client, tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    async with running_worker(client, settings) as worker:
        policy = HangingPolicy(worker)
        async with PolicyServer(policy) as server:
            handles = [
                await start_rollout(
                    client,
                    RolloutInput(
                        env="counter-replayable",
                        task=Task(id=f"hang-{i}", prompt=f"count to 5: hang-{i}", ground_truth="5"),
                        model=ModelConfig(base_url=server.url),
                    ),
                    task_queue=settings.task_queue,
                )
                for i in range(ROLLOUTS)
            ]
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), timeout=300)
        assert worker.env.env("counter-replayable").live_rollouts() == []  # type: ignore[attr-defined]
    latencies = []
    for handle, result in zip(handles, results, strict=True):
        observations = [m for m in result.messages if m.role == "tool"]
        assert observations[1].is_error and f"timed out after {TOOL_TIMEOUT_S:g}s" in observations[1].content
        assert [o.content for o in observations[::2]] == ["2", "5"]  # the counter was rebuilt, then went on
        assert result.recoveries == 1 and not result.infra_failed
        assert result.reward is not None and result.reward.total == 1.0
        events = (await handle.fetch_history()).events
        scheduled = {
            e.event_id: e.event_time.ToDatetime()
            for e in events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "call_tool"
        }
        completed = [
            e.event_time.ToDatetime() - scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
            for e in events
            if e.HasField("activity_task_completed_event_attributes")
            and e.activity_task_completed_event_attributes.scheduled_event_id in scheduled
        ]
        latencies.append(completed[1].total_seconds())  # the second call: the one that hung
    assert max(latencies) < TOOL_TIMEOUT_S + SLACK_S, latencies
    assert len(policy.hung) == ROLLOUTS and policy.killed_in_time == set(policy.hung)
    figures.record(
        "chaos", f"a tool that hangs forever, {ROLLOUTS} rollouts at once (tool timeout {TOOL_TIMEOUT_S:g} s)",
        started=ROLLOUTS, completed=sum(not r.infra_failed for r in results), lost=0, duplicated=0,
        observation_p50_s=round(statistics.median(latencies), 2), observation_max_s=round(max(latencies), 2),
        hung_servers_killed=len(policy.killed_in_time), recovered=sum(r.recoveries for r in results),
    )  # fmt: skip
