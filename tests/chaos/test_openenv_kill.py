"""kill -9 the worker holding the env of an episode OpenEnv's client drives through the exporter.

OpenEnv's own client (in the OpenEnv package's venv) plays a replayable counter served by
`gymflow envs serve`'s exporter; the episode is a gymflow session on two real `gymflow worker`
processes. The worker holding the env is killed between two steps: the client's next step still
answers, from the env rebuilt on the other node (the recorded increments replayed and checked),
and the episode ends scored, with every step in its trajectory.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import figures
import pytest
from chaos_support import counting_env_file, executions, fleet, fleet_spec
from env_packages import PACKAGES_ROOT
from interop_support import Driver, record_of, require
from mcp_support import node_ids, wait_polling
from temporalio.client import Client

from gymflow.activities.names import node_queue
from gymflow.activities.schema import RetrySettings, RolloutLimits
from gymflow.activities.session_schema import SessionInput
from gymflow.envs.contract import Task, Trajectory
from gymflow.workers.sdk.openenv import OpenEnvExporter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def increment(by: int, tag: str) -> dict[str, object]:
    call = {"id": tag, "name": "increment", "arguments": {"by": by, "tag": tag}}
    return {"message": {"role": "assistant", "tool_calls": [call]}}


async def test_an_openenv_episode_survives_its_worker_killed(
    client: Client, temporal_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYMFLOW_ENV_PACKAGES_DIR", str(PACKAGES_ROOT))
    require("oe")

    log = tmp_path / "executions.jsonl"
    queue = f"chaos-openenv-{uuid.uuid4().hex[:8]}"
    env = str(counting_env_file(tmp_path, log))
    task = Task(id="s", prompt="count", ground_truth="9")
    template = SessionInput(
        env=env,
        task=task,
        limits=RolloutLimits(tool_timeout_s=10),
        retry=RetrySettings(node_timeout_s=3, max_recoveries=3),
    )
    nodes = node_ids(2)
    with fleet(fleet_spec(tmp_path, temporal_address, queue), tmp_path / "fleet") as workers:
        await wait_polling(client, [node_queue(queue, node) for node in nodes])
        async with OpenEnvExporter(client, env=env, task_queue=queue, tasks=[task], template=template) as exporter:
            driver = Driver(record_of("oe").python_path, f"http://127.0.0.1:{exporter.port}")
            try:
                first = await driver.send("reset", data={"episode_id": "chaos", "task_id": "s"})
                assert (await driver.send("step", action=increment(2, "s/0")))["observation"]["messages"][0][
                    "content"
                ] == "2"
                assert (await driver.send("step", action=increment(3, "s/1")))["observation"]["messages"][0][
                    "content"
                ] == "5"
                workers.kill(nodes.index(first["observation"]["node_id"]))  # mid-episode; it stays dead
                step = await driver.send("step", action=increment(4, "s/2"))
                assert not step["done"] and step["observation"]["messages"][0]["content"] == "9", step
                done = await driver.send("step", action={"text": "9"})
                assert done["done"] and done["reward"] == 1.0, done
            finally:
                driver.close()
    trajectory = await client.get_workflow_handle("openenv-chaos", result_type=Trajectory).result()
    assert trajectory.recoveries == 1 and not trajectory.infra_failed and trajectory.turns == 4
    assert [m.content for m in trajectory.messages if m.role == "tool"] == ["2", "5", "9"]  # no step lost
    assert executions(log) == {"s/0": 2, "s/1": 2, "s/2": 1}  # the earlier two once more, as the replay
    figures.record("chaos", "kill -9 the worker holding an OpenEnv episode", recoveries=trajectory.recoveries)
