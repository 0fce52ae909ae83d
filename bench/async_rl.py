"""Synchronous against asynchronous RL with the reference trainer, on this box, at a model's latency.

    python -m bench.async_rl --out bench/results/async_rl.json [--steps 10 --latency 1.0]

Two training runs of envs/examples/train_math.yaml, launched as a user launches them (`gymflow train
launch --wait`, an embedded dev server, the CLI's in-process worker), with the trainer's policy served
at `--latency` seconds a completion (0.5x to 1.5x, uniformly: a model's generation time):

* sync: every step plays its 8 groups of 8 on the last policy and waits for all of them;
* async (`algorithm.extra.async`): groups of two steps are in flight, a step takes the first 8 that
  finish and are at most `--max-staleness` versions old, and each new policy is announced to the
  rollouts still running, which move to it at their next turn.

Printed (JSON, and a PNG beside --out): each run's training wall time (`train_s`, first step to last),
reward per step, the final checkpoint against the starting policy on 100 eval tasks (mean and
P(improvement) with 95 % intervals), and for async the per-step histogram of group lags (versions
between a group's oldest turn and the policy it was trained on). Goal (issue 36): async reaches the
same quality (P(improvement) >= 0.95) in <= 0.7x the synchronous wall time, no lag above the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(name: str, config: dict[str, Any], address: str, tmp: Path) -> dict[str, Any]:
    """One `gymflow train launch --wait --json` of `config`; its result, manifest and wall time."""
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "GYMFLOW_TEMPORAL_ADDRESS": address, "GYMFLOW_DATA_DIR": str(tmp / "data"),
           "GYMFLOW_TASK_QUEUE": f"bench-{name}", "GYMFLOW_WORKSPACE_ROOT": str(tmp / "ws")}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", "train", "launch", str(path), "--wait", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{name}: gymflow train launch failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    manifest = json.loads(Path(result["manifest_uri"].removeprefix("file://")).read_text())
    history = [h for h in manifest.get("history", []) if h.get("step", 0) > 0]
    final = result["checkpoints"][-1]["eval"]
    lags: dict[str, float] = {}
    for h in history:
        for key, value in h.items():
            if key.startswith("lag_") and key[4:].isdigit():
                lags[key[4:]] = lags.get(key[4:], 0) + value
    return {
        "command_s": time.monotonic() - started,
        "train_s": history[-1]["train_s"],
        "reward_per_step": [(int(h["step"]), h["reward"]) for h in history],
        "lag_max": max((h.get("lag_max", 0.0) for h in history), default=0.0),
        "stale_rerun": max((h.get("stale_rerun", 0.0) for h in history), default=0.0),
        "lag_histogram": lags,
        "final": {
            k: final[k]
            for k in (
                "checkpoint",
                "mean",
                "mean_low",
                "mean_high",
                "baseline_mean",
                "probability_of_improvement",
                "poi_low",
                "poi_high",
                "n_tasks",
                "infra_failed",
            )
        },
    }


def plot(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in (("sync", "C0"), ("async", "C1")):
        steps = data[name]["reward_per_step"]
        per_step = data[name]["train_s"] / max(len(steps), 1)
        label = f"{name}: {data[name]['train_s']:.0f} s, final eval {data[name]['final']['mean']:.2f}"
        ax.plot([s * per_step for s, _ in steps], [r for _, r in steps], marker=".", color=color, label=label)
    ax.set(xlabel="training wall time (s, steps spread evenly)", ylabel="training reward", ylim=(-0.05, 1.05),
           title=f"reference trainer, model latency {data['latency_s']} s per turn")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/out/async_rl.json"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--in-flight-steps", type=int, default=2)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    from gymflow.workers.servers.temporal import temporal_binary

    base = yaml.safe_load((ROOT / "envs" / "examples" / "train_math.yaml").read_text())
    base["algorithm"]["steps"] = args.steps
    base["algorithm"]["checkpoint_every"] = args.steps
    base["algorithm"]["tasks_per_step"] = args.tasks_per_step
    base["algorithm"]["group_size"] = args.group_size
    tmp = Path(tempfile.mkdtemp(prefix="gymflow-async-rl-"))
    port = free_port()
    server = subprocess.Popen(
        [temporal_binary(), "server", "start-dev", "--port", str(port), "--ui-port", str(free_port()), "--headless",
         "--log-level", "error", *(f"--search-attribute={k}={t}" for k, t in (
             ("GymflowEnv", "Keyword"), ("GymflowStatus", "Keyword"), ("GymflowReward", "Double"),
             ("GymflowBatch", "Keyword"), ("GymflowModel", "Keyword"), ("GymflowTask", "Keyword"),
             ("GymflowRun", "Keyword")))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    data: dict[str, Any] = {"latency_s": args.latency, "steps": args.steps, "tasks_per_step": args.tasks_per_step,
                            "group_size": args.group_size, "max_staleness": args.max_staleness,
                            "in_flight_steps": args.in_flight_steps}  # fmt: skip
    try:
        for name, extra in (("sync", {}), ("async", {"asynchronous": True, "max_staleness": args.max_staleness,
                                                      "in_flight_steps": args.in_flight_steps})):  # fmt: skip
            config = json.loads(json.dumps(base))
            config["run_id"] = f"bench-{name}-{int(time.time())}"
            config["algorithm"]["extra"] = {**extra, "turn_latency_s": args.latency}
            data[name] = run(name, config, f"127.0.0.1:{port}", tmp)
            print(f"{name}: train {data[name]['train_s']:.1f} s, final {data[name]['final']}", file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=30)
    data["ratio"] = data["async"]["train_s"] / data["sync"]["train_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1))
    plot(data, args.out.with_suffix(".png"))
    print(json.dumps({k: data[k] if k in ("ratio", "latency_s") else
                      {x: data[k][x] for x in ("train_s", "lag_max", "stale_rerun", "lag_histogram", "final")}
                      for k in ("sync", "async", "ratio", "latency_s")}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
