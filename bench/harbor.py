"""Benchmark: what a Harbor rollout through gymflow costs over running the same commands with plain podman.

    python bench/harbor.py [--samples 10] [--task edit-config]

Both sides play the task's oracle on the same image, one rollout at a time:

* gymflow: a RolloutWorkflow on an embedded dev server and an in-process worker (init: a container
  from the container runtime with its capped disk and limits; the oracle policy over HTTP writes
  solve.sh and runs it through the terminal tool; the verifier in the same container; release);
* plain: `podman run -d` (runc, no network), `podman exec` to write solve.sh, run it, `podman cp`
  the tests in, run test.sh, read the reward file, `podman rm -f`.

Writes bench/out/harbor.json and harbor.png (per-rollout wall time of each side; a run's copies are in
bench/results/). Needs podman and the base image (bootstrapped from Debian's packages on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import SEARCH_ATTRIBUTES
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.harbor.env import HarborEnv
from gymflow.envs.builtin.harbor.policy import OraclePolicy
from gymflow.envs.builtin.harbor.task import load_task
from gymflow.envs.runtime.engine import Engine
from gymflow.envs.runtime.images import build_image
from gymflow.workers.client import data_converter
from gymflow.workers.config import Settings
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.servers.temporal import temporal_binary
from gymflow.workers.worker import running_worker

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "envs" / "harbor" / "tasks"
OUT = ROOT / "bench" / "out"
STATE_ROOT = Path("/var/tmp/gymflow-bench-runtime")


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_s": round(statistics.median(ordered), 3),
        "p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
        "mean_s": round(statistics.fmean(ordered), 3),
    }


async def gymflow_side(task_dir: Path, samples: int, tmp: Path) -> list[float]:
    [task] = HarborEnv.load_dataset(str(task_dir))
    env = WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=data_converter(Settings()),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
    )
    times = []
    async with await env as server, PolicyServer(OraclePolicy()) as policy:
        settings = Settings(
            task_queue=f"bench-{uuid.uuid4().hex[:8]}", workspace_root=tmp / "ws", data_dir=tmp / "data",
            runtime_state_dir=STATE_ROOT,
        )  # fmt: skip
        async with running_worker(server.client, settings) as worker:
            for index in range(samples + 1):  # the first one builds the image and warms every cache
                started = time.monotonic()
                result = await run_rollout(
                    server.client,
                    RolloutInput(env="harbor", task=task, model=ModelConfig(base_url=policy.url)),
                    task_queue=worker.task_queue,
                )
                elapsed = time.monotonic() - started
                assert result.reward is not None and result.reward.total == 1.0, result.error
                if index:
                    times.append(elapsed)
    return times


async def plain_side(task_dir: Path, samples: int) -> list[float]:
    task = load_task(task_dir)
    engine = Engine.detect("podman")
    image = await build_image(
        engine, name=task.name, context=task.environment_dir, dockerfile=task.dockerfile, state_dir=STATE_ROOT
    )
    assert task.solution_dir is not None
    solve = (task.solution_dir / "solve.sh").read_bytes()
    times = []
    for _ in range(samples):
        name = f"bench-plain-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        flags = [*engine.run_flags(), "--ulimit", "nproc=512:512", "--network", "none"]  # as gymflow's: see limit_flags
        await engine.run(["run", "-d", "--name", name, *flags, image, "sleep", "inf"])
        try:
            await engine.run(["exec", "-i", name, "sh", "-c", "mkdir -p /solution && cat > /solution/solve.sh"],
                             stdin=solve)  # fmt: skip
            await engine.run(["exec", name, "bash", "/solution/solve.sh"])
            await engine.run(["exec", name, "mkdir", "-p", "/logs/verifier"])
            await engine.run(["cp", str(task.tests_dir), f"{name}:/tests"])
            await engine.run(["exec", name, "bash", "/tests/test.sh"])
            reward = await engine.run(["exec", name, "cat", "/logs/verifier/reward.txt"])
            assert float(reward.stdout) == 1.0
        finally:
            await engine.run(["rm", "-f", "-t", "0", name], check=False)
        times.append(time.monotonic() - started)
    return times


def plot(results: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot(list(results.values()), tick_labels=list(results))
    ax.set_ylabel("seconds per rollout")
    ax.set_title("Harbor task (oracle): gymflow rollout vs plain podman")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--task", default="edit-config")
    args = parser.parse_args()
    task_dir = TASKS / args.task
    plain = await plain_side(task_dir, args.samples)
    with tempfile.TemporaryDirectory(prefix="gymflow-bench-") as tmp:
        rollouts = await gymflow_side(task_dir, args.samples, Path(tmp))
    overhead = statistics.median(rollouts) - statistics.median(plain)
    report = {
        "task": args.task,
        "samples": args.samples,
        "gymflow_rollout": summary(rollouts),
        "plain_podman": summary(plain),
        "overhead_p50_s": round(overhead, 3),
        "raw": {"gymflow_rollout": [round(t, 3) for t in rollouts], "plain_podman": [round(t, 3) for t in plain]},
        "measured": time.strftime("%Y-%m-%d"),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "harbor.json").write_text(json.dumps(report, indent=2) + "\n")
    plot({"gymflow rollout": rollouts, "plain podman": plain}, OUT / "harbor.png")
    print(json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
