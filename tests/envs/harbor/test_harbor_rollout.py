"""Harbor rollouts through the whole engine: workflow -> worker -> container -> verifier.

By default: one rollout whose container is killed mid-rollout (detected, a fresh container, the tool
calls replayed, then scored by the verifier), and `gymflow eval harbor` on three tasks (oracle 1.0,
null 0.0, a crashing verifier flagged). The whole suite is test_harbor_eval.py (`-m slow`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from container_support import leftovers
from temporalio.client import Client

from gymflow.envs.builtin.harbor.env import HarborEnv
from gymflow.envs.contract import Message, TerminationReason
from gymflow.envs.runtime.engine import Engine
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call, play

TASKS = Path(__file__).parent / "tasks"


def kill_containers(node: str) -> None:
    """Kill the node's rollout containers from outside, as an engine (or an OOM killer of the host) would."""
    listed = subprocess.run(
        ["podman", "ps", "-q", "--filter", "label=gymflow=1", "--filter", f"label=gymflow.node={node}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    names = listed.stdout.split()
    assert names, "no container to kill"
    subprocess.run(["podman", "kill", *names], capture_output=True, check=True)


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
    assert await leftovers(Engine.detect("podman"), worker.settings.node_id) == []


def test_eval_harbor_oracle_scores_one_null_zero_and_a_crashed_verifier_is_flagged(
    temporal_address: str, tmp_path: Path, base_image: str
) -> None:
    del base_image
    dataset = tmp_path / "tasks"
    dataset.mkdir()
    for name in ("edit-config", "partial-credit", "verifier-crash"):
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
        assert report[side]["completed"] == 2 and report[side]["infra_failed"] == 1, report[side]


def test_without_an_engine_harbor_refuses_naming_the_install_command(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "gymflow.workers.cli", "eval", "harbor", "--dataset", str(TASKS)]
    env = {**os.environ, "GYMFLOW_CONTAINER_ENGINE": "no-such-engine"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False)
    assert run.returncode == 2
    assert "harbor cannot work on this node" in run.stderr
    assert "apt-get install podman runc mmdebstrap e2fsprogs" in run.stderr
