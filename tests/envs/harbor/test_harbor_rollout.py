"""Harbor rollouts through the whole engine: workflow -> worker -> container -> verifier.

By default: one rollout whose container is killed mid-rollout (detected, a fresh container, the tool
calls replayed, then scored by the verifier), and the refusal without an engine. With `-m slow`:
`gymflow eval harbor` on two tasks (oracle 1.0, null 0.0, a crashing verifier flagged); the whole
suite through the SDK is test_harbor_eval.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from container_support import leftovers
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.harbor.env import HarborEnv
from gymflow.envs.contract import Message, TerminationReason
from gymflow.envs.errors import EnvUnavailableError
from gymflow.envs.runtime.engine import Engine
from gymflow.workers.cli.commands import preflight
from gymflow.workers.reaper import reap_closed
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call, play

TASKS = Path(__file__).parent / "tasks"


def kill_containers(node: str) -> None:
    """Kill the node's rollout containers from outside, as an engine (or an OOM killer of the host) would."""
    listed = subprocess.run(
        [Engine.detect().binary, "ps", "-q", "--filter", "label=gymflow=1", "--filter", f"label=gymflow.node={node}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    names = listed.stdout.split()
    assert names, "no container to kill"
    subprocess.run([Engine.detect().binary, "kill", *names], capture_output=True, check=True)


async def test_a_killed_container_is_replaced_and_replayed_then_scored(
    client: Client, worker: RunningWorker, base_image: str
) -> None:
    del base_image
    [task] = HarborEnv.load_dataset(str(TASKS / "edit-config"))
    fix = call("bash", {"command": "sed -i 's/^port = 8080$/port = 9090/' /app/config.ini && echo fixed"})
    look = call("bash", {"command": "grep -c '^port = 9090$' /app/config.ini"})
    policy = ScriptedPolicy(
        [Message(role="assistant", tool_calls=[fix]), Message(role="assistant", tool_calls=[look]),
         Message(role="assistant", content="done")],
        before_turn={1: lambda: kill_containers(worker.settings.node_id)},
    )  # fmt: skip
    result = await play(client, worker, policy, env="harbor", task=task)
    assert result.termination == TerminationReason.FINAL_ANSWER, result.error
    assert result.recoveries == 1  # the dead container was noticed, the rollout moved to a fresh one
    observations = [m.content for m in result.messages if m.role == "tool"]
    assert observations[1].startswith("1\n"), observations  # the replayed fix is in the new container
    assert result.reward is not None and result.reward.total == 1.0
    assert await leftovers(Engine.detect(), worker.settings.node_id) == []


async def test_a_terminated_rollouts_container_is_reaped(
    client: Client, worker: RunningWorker, base_image: str
) -> None:
    del base_image
    [task] = HarborEnv.load_dataset(str(TASKS / "edit-config"))
    engine = Engine.detect()
    hang = call("bash", {"command": "sleep 120", "timeout": 300})
    policy = ScriptedPolicy([Message(role="assistant", tool_calls=[hang]), Message(role="assistant", content="done")])
    async with PolicyServer(policy) as server:
        handle = await start_rollout(
            client,
            RolloutInput(env="harbor", task=task, model=ModelConfig(base_url=server.url)),
            task_queue=worker.task_queue,
        )
        deadline = time.monotonic() + 120
        while not worker.env.held():  # the rollout's init is done: its container is up and held
            assert time.monotonic() < deadline, "the rollout never started"
            await asyncio.sleep(0.2)
        assert await leftovers(engine, worker.settings.node_id)
        await handle.terminate("closed from outside: no release runs")
        # The worker's reaper round (every reap_interval_s), run now: the closed rollout's container goes.
        assert await reap_closed(client, worker.env)
        assert await leftovers(engine, worker.settings.node_id) == []


@pytest.mark.slow  # ~25 s (a CLI process with its worker): the default suite is near its budget
def test_eval_harbor_oracle_scores_one_null_zero_and_a_crashed_verifier_is_flagged(
    temporal_address: str, tmp_path: Path, base_image: str
) -> None:
    del base_image
    dataset = tmp_path / "tasks"
    dataset.mkdir()
    for name in ("edit-config", "verifier-crash"):
        (dataset / name).symlink_to(TASKS / name)
    out_dir = tmp_path / "report"
    command = [
        sys.executable, "-m", "gymflow.workers.cli", "eval", "harbor", "--dataset", str(dataset),
        "--policy", "oracle", "--baseline", "null", "--reps", "200", "--out", str(out_dir), "--json",
        "--address", temporal_address, "--task-queue", f"eval-{uuid.uuid4().hex[:8]}",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out_dir / "report.json").read_text())
    assert report["policy"]["mean"]["value"] == 1.0, report["policy"]
    assert report["baseline"]["mean"]["value"] == 0.0
    for side in ("policy", "baseline"):  # the crashed verifier is flagged on both sides, never scored
        assert report[side]["completed"] == 1 and report[side]["infra_failed"] == 1, report[side]


def test_without_an_engine_harbor_refuses_naming_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFLOW_CONTAINER_ENGINE", "no-such-engine")  # what `gymflow eval harbor` checks first
    with pytest.raises(EnvUnavailableError) as refused:
        preflight("harbor")
    assert "harbor cannot work on this node" in str(refused.value)
    assert "apt-get install podman runc mmdebstrap e2fsprogs (or docker.io" in str(refused.value)
