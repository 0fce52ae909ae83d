"""The sheets env under load: rollouts/s at growing windows, and whether the worker kept up.

    python -m bench.load [--n 200] [--windows 8 32 128] [--address HOST:PORT]

Writes bench/out/load.{json,png}. Each window runs exactly what a user runs,
`gymflow eval sheets --policy reference --n N --window W --json` (in-process worker, default
settings otherwise), against one dev server started as `gymflow server` starts it (or `--address`).
Per window: the command's wall time, the batch's own time (first rollout start to last close)
and rollouts/s over it, scored / infra-failed rollouts and the mean reward from the command's
JSON, and, from every history of the batch (`bench.health`), activity heartbeat timeouts, other
activity timeouts, failed workflow tasks and workflow tasks over 2 s. The load average before
and after each run is recorded next to its figures: other work on the machine moves wall times.
A healthy worker keeps throughput flat or rising with the window and every count at 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.health import COUNTS, batch_health  # noqa: E402
from bench.procs import Procs, load, start_server  # noqa: E402
from gymflow.workers.client import connect  # noqa: E402

OUT = ROOT / "bench" / "out"
GYMFLOW = Path(sys.executable).with_name("gymflow")


def last_json(text: str) -> dict[str, Any]:
    """The last JSON object printed at the start of a line of `text` (stdout may carry log lines
    before it where the SDK core's logger writes to stdout)."""
    starts = [i for i in range(len(text)) if text[i] == "{" and (i == 0 or text[i - 1] == "\n")]
    for start in reversed(starts):
        try:
            value = json.loads(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise ValueError(f"no JSON object in the output: {text[-500:]!r}")


def run_eval(address: str, data_dir: Path, *, n: int, window: int | None, timeout_s: float) -> dict[str, Any]:
    """`gymflow eval sheets --policy reference --json` as a user runs it; summary, wall time, stdout purity."""
    command = [str(GYMFLOW), "eval", "sheets", "--policy", "reference", "--n", str(n), "--json"]
    command += ["--address", address, "--data-dir", str(data_dir)]
    if window is not None:
        command += ["--window", str(window)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=data_dir)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-3000:]}")
    try:
        json.loads(done.stdout)
        stray = ""
    except json.JSONDecodeError:
        stray = done.stdout[: done.stdout.rfind("\n{")][:500]  # what came before the document
    return {"summary": last_json(done.stdout), "wall_s": round(wall, 2), "stdout_pure_json": not stray, "stray": stray}


async def batch_span(address: str, batch_id: str) -> float:
    """Seconds from the batch's first rollout start to its last close."""
    client = await connect(address)
    starts, closes = [], []
    async for w in client.list_workflows(f'GymflowBatch="{batch_id}"'):
        starts.append(w.start_time.timestamp())
        if w.close_time is not None:
            closes.append(w.close_time.timestamp())
    return max(closes) - min(starts) if starts and closes else float("nan")


async def measure(address: str, data_dir: Path, *, n: int, window: int | None, timeout_s: float) -> dict[str, Any]:
    """One eval run at `window` and its counts."""
    before = load()
    ran = await asyncio.to_thread(run_eval, address, data_dir, n=n, window=window, timeout_s=timeout_s)
    after = load()
    summary = ran["summary"]
    policy = summary["policy"]
    batch_id = summary["batches"][0]["batch_id"]
    client = await connect(address)
    health = await batch_health(client, batch_id)
    span = await batch_span(address, batch_id)
    return {
        "window": window,
        "rollouts": policy["rollouts"],
        "scored": policy["completed"],
        "infra_failed": policy["infra_failed"],
        "mean_reward": policy["mean"]["value"] if policy.get("mean") else None,
        "wall_s": ran["wall_s"],
        "batch_s": round(span, 2),
        "rollouts_per_s": round(policy["rollouts"] / span, 3) if math.isfinite(span) and span > 0 else None,
        "stdout_pure_json": ran["stdout_pure_json"],
        **({"stdout_before_json": ran["stray"]} if ran["stray"] else {}),
        **{k: health[k] for k in COUNTS},
        "max_workflow_task_s": health["max_workflow_task_s"],
        "activity_timeouts_by_type": health["activity_timeouts_by_type"],
        "workflows": health["workflows"],
        "batch_id": batch_id,
        "load_before": before,
        "load_after": after,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["runs"]
    labels = [str(r["window"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bars = ax.bar(labels, [r["rollouts_per_s"] or 0 for r in rows], color="tab:green")
    ax.bar_label(
        bars,
        labels=[
            f"{r['rollouts_per_s']:.2f}/s\n{r['heartbeat_timeouts']} hb t/o, {r['slow_workflow_tasks']} slow WFT\n"
            f"load {r['load_before']['load1']:.0f}-{r['load_after']['load1']:.0f}"
            for r in rows
        ],
        fontsize=8,
    )
    ax.set(
        xlabel="window (rollouts in flight)",
        ylabel="rollouts / s (higher is better)",
        title=f"sheets, reference policy, {report['n']} rollouts per window, {report['cpus']} cores",
    )
    ax.margins(y=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    procs = Procs()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        address = args.address or await start_server(procs, data_dir, extra_args=[])
        runs = []
        for window in args.windows:
            row = await measure(address, data_dir, n=args.n, window=window, timeout_s=args.timeout_s)
            print(json.dumps(row), file=sys.stderr)
            runs.append(row)
    finally:
        procs.stop_all()
    return {"n": args.n, "cpus": os.cpu_count(), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="rollouts per window")
    parser.add_argument("--windows", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--address", help="an existing Temporal server (default: start a dev server)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per eval run")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run(args))
    (OUT / "load.json").write_text(json.dumps(report, indent=2))
    plot(report, OUT / "load.png")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
