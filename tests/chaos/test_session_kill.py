"""kill -9 the worker process holding a trainer-driven session's env between two steps.

Two real `gymflow worker` processes; the session's env (a replayable counter) lives on one of them.
After that process is killed, the next step still succeeds on the same session: the session
re-initialises the env on the surviving node, replays the recorded increments (checking each
result), then runs the new one, so the tool state is intact and the reward reads it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import figures
import pytest
from chaos_support import call_ledger, counting_env_file, executions, fleet, fleet_spec
from mcp_support import node_ids, wait_polling
from temporalio.client import Client

from gymflow.activities.names import node_queue
from gymflow.activities.schema import RetrySettings, RolloutLimits
from gymflow.activities.session_schema import SessionInput
from gymflow.envs.contract import Message, Task, ToolCall
from gymflow.workers.sdk.sessions import start_session

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def increment(by: int, tag: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=tag, name="increment", arguments={"by": by, "tag": tag})])


async def test_a_session_survives_its_worker_killed_between_steps(
    client: Client, temporal_address: str, tmp_path: Path
) -> None:
    log = tmp_path / "executions.jsonl"
    queue = f"chaos-session-{uuid.uuid4().hex[:8]}"
    spec = fleet_spec(tmp_path, temporal_address, queue)
    nodes = node_ids(2)
    with fleet(spec, tmp_path / "fleet") as workers:
        await wait_polling(client, [node_queue(queue, node) for node in nodes])
        session = await start_session(
            client,
            SessionInput(
                env=str(counting_env_file(tmp_path, log)),
                task=Task(id="s", prompt="count", ground_truth="9"),
                limits=RolloutLimits(tool_timeout_s=10),
                retry=RetrySettings(node_timeout_s=3, max_recoveries=3),
            ),
            task_queue=queue,
        )
        first = await session.reset()
        assert (await session.step(increment(2, "s/0"))).observations[0].content == "2"
        assert (await session.step(increment(3, "s/1"))).observations[0].content == "5"

        holder = nodes.index(first.node_id)
        workers.kill(holder)  # between two trainer steps; it stays dead
        killed, killed_at = time.monotonic(), workers.kills[-1][1]
        step = await session.step(increment(4, "s/2"))
        recovery_s = time.monotonic() - killed
        assert not step.done and step.observations[0].content == "9", step  # 2 + 3 replayed, then 4
        done = await session.step(Message(role="assistant", content="9"))
        assert done.done and done.reward is not None and done.reward.total == 1.0  # read from the rebuilt server
        trajectory = await session.close()
    assert trajectory.recoveries == 1 and not trajectory.infra_failed
    ledger = await call_ledger(client, session.id)
    (recovered_at,) = ledger.recovered_at  # the re-initialisation on the surviving node completed
    assert ledger.calls["s/0"].replays_completed == 1 and ledger.calls["s/1"].replays_completed == 1
    # The new call was first scheduled on the dead node's queue (timed out unstarted), then ran once.
    assert ledger.calls["s/2"].scheduled == 2 and ledger.calls["s/2"].completed == 1
    ran = executions(log)
    assert ran == {"s/0": 2, "s/1": 2, "s/2": 1}  # each earlier call once more, as a replay; the new one once
    figures.record(
        "chaos", "kill -9 the worker holding a session between two steps",
        recoveries=trajectory.recoveries, next_step_s=round(recovery_s, 1),
        reinitialised_after_s=round((recovered_at - killed_at).total_seconds(), 1), reward=done.reward.total,
    )  # fmt: skip
