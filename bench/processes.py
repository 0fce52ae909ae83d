"""Worker processes per node: 1 vs N worker processes on this box, `python -m bench.processes`.

Writes bench/out/processes.{json,png}. One run starts a dev server (as `gymflow server` does), the
benchmark policy endpoint (bench/workload.py) and, per variant, a worker: one process
(`--processes 1`, today's worker) or the `gymflow worker --processes N` supervisor with N
children (gymflow.workers.processes; bench/worker.py registers the benchmark env in each). Each variant
runs scenario (c) of bench/run.py — model 2 s per turn, tool 100 ms, 4 tool turns, 128 rollouts at
once — `--repeats` times, alternating with the other variants; the figure is each variant's best
wall time and its rollouts per second, with CPU seconds per process (the supervisor's children
counted one by one) and the load average around every run: the box's cores are shared with the
Temporal server, the policy endpoint, this driver, and whatever else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.direct import DirectRunner  # noqa: E402
from bench.procs import Procs, load, start_policy, start_server  # noqa: E402
from bench.scenarios import FUSED, Bench, Runner, batch, side_by_side  # noqa: E402
from bench.workload import BenchEnv  # noqa: E402
from gymflow.workers.client import connect  # noqa: E402

OUT = ROOT / "bench" / "out"
ROLLOUTS, TOOL_TURNS, MODEL_S, TOOL_S = 128, 4, 2.0, 0.1
"""Scenario (c) of bench/run.py: 128 rollouts at once, 4 tool turns, model 2 s per turn, tool 100 ms."""


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def start_workers(procs: Procs, label: str, *, processes: int, address: str, task_queue: str) -> None:
    """A worker of `processes` processes; returns once every one of them polls (prints ``ready``)."""
    command = [sys.executable, "-m", "bench.worker", "--mode", "gymflow", "--address", address]
    command += ["--task-queue", task_queue, "--processes", str(processes)]
    popen = procs.spawn(label, command, cwd=ROOT, stdout=subprocess.PIPE)
    assert popen.stdout is not None
    for _ in range(processes):
        line = await asyncio.wait_for(asyncio.to_thread(popen.stdout.readline), 180)
        if line.strip() != b"ready":
            raise RuntimeError(f"worker {label} did not start: {line!r}")
    if processes > 1:  # CPU of each child: the supervisor's own figure counts them only once reaped
        for i, child in enumerate(children(popen.pid)):
            procs.pids[f"{label}/p{i}"] = child


async def main_async(processes: list[int], repeats: int) -> dict[str, Any]:
    procs = Procs()
    data_dir = Path(tempfile.mkdtemp(prefix="gymflow-bench-processes-"))
    try:
        address = await start_server(procs, data_dir, extra_args=[])
        policy_base = await start_policy(procs)
        client = await connect(address)
        runners = []
        for n in processes:
            label = f"{n}-process" + ("es" if n > 1 else "")
            queue = f"bench-procs-{n}-{uuid.uuid4().hex[:6]}"
            await start_workers(procs, label, processes=n, address=address, task_queue=queue)
            runners.append(Runner(label, "gymflow", task_queue=queue, plan=FUSED))  # the bench env's default plan
        bench = Bench(client, procs, policy_base, DirectRunner(BenchEnv()))

        async def warm_up(runner: Runner) -> float:  # connections, caches, imports in every process
            return await batch(bench, runner, rollouts=16, concurrency=16, tool_turns=1, model_s=0, tool_s=0)

        async def run(runner: Runner) -> float:
            return await batch(
                bench,
                runner,
                rollouts=ROLLOUTS,
                concurrency=ROLLOUTS,
                tool_turns=TOOL_TURNS,
                model_s=MODEL_S,
                tool_s=TOOL_S,
            )

        raw = await side_by_side(bench, runners, repeats=repeats, run=run, warm_up=warm_up)
        await bench.direct.aclose()
    finally:
        procs.stop_all()
    rows = {}
    for label, records in raw.items():
        best = min(r["batch_wall_s"] for r in records)
        rows[label] = {
            "wall_s": round(best, 2),
            "wall_s_runs": [round(r["batch_wall_s"], 2) for r in records],
            "rollouts_per_s": round(ROLLOUTS / best, 2),
            "load1_after": [r["load_after"]["load1"] for r in records],
        }
    return {
        "scenario": {
            "rollouts": ROLLOUTS,
            "concurrency": ROLLOUTS,
            "tool_turns": TOOL_TURNS,
            "model_s": MODEL_S,
            "tool_s": TOOL_S,
        },
        "ideal_rollout_s": round((TOOL_TURNS + 1) * MODEL_S + TOOL_TURNS * TOOL_S, 2),
        "repeats": repeats,
        "runners": rows,
        "runs": raw,
        "load_end": load(),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(report["runners"])
    fig, (wall, cpu) = plt.subplots(1, 2, figsize=(11, 4))
    walls = [report["runners"][label]["wall_s"] for label in labels]
    bars = wall.bar(labels, walls, color=["#4c72b0", "#dd8452", "#55a868"][: len(labels)])
    for bar, label in zip(bars, labels, strict=True):
        rate = report["runners"][label]["rollouts_per_s"]
        top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
        wall.annotate(f"{bar.get_height():.1f} s\n{rate} rollouts/s", top, ha="center", va="bottom", fontsize=9)
    wall.axhline(report["ideal_rollout_s"], color="grey", ls="--", lw=1, label="one rollout, no overhead")
    wall.set_ylim(0, max(walls) * 1.2)
    wall.set_ylabel("wall time of the batch (s), best run")
    title = f"{report['scenario']['rollouts']} rollouts at once (model 2 s/turn, tool 100 ms, 4 tools)"
    wall.set_title(title, fontsize=10)
    wall.legend(loc="lower right", fontsize=8)
    # CPU seconds per process role in each variant's best run.
    for i, label in enumerate(labels):
        best = min(report["runs"][label], key=lambda r: r["batch_wall_s"])
        mine = {"server", "policy", "driver", label}
        roles = {k: v for k, v in best["cpu_s"].items() if k in mine or k.startswith(label + "/")}
        bottom = 0.0
        for role, seconds in sorted(roles.items()):
            worker = role == label or role.startswith(label + "/")
            cpu.bar(i, seconds, bottom=bottom, color="#dd8452" if worker else "#c8d3e6", edgecolor="white")
            if seconds >= 1.5:  # the policy and the driver take well under a second
                cpu.annotate(f"{role} {seconds:.1f}", (i, bottom + seconds / 2), ha="center", va="center", fontsize=7)
            bottom += seconds
    cpu.set_xticks(range(len(labels)), labels)
    cpu.set_ylabel("CPU seconds during the best run")
    load_end = report["load_end"]
    cpu.set_title(f"CPU by process ({load_end['cpus']} cores; load1 at end {load_end['load1']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="variants (processes per worker)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternating")
    args = parser.parse_args()
    started = time.monotonic()
    report = asyncio.run(main_async(args.processes, args.repeats))
    report["bench_wall_s"] = round(time.monotonic() - started, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "processes.json").write_text(json.dumps(report, indent=2))
    plot(report, OUT / "processes.png")
    print(json.dumps({"runners": report["runners"], "load_end": report["load_end"]}, indent=2))


if __name__ == "__main__":
    main()
