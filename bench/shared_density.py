"""Open rollouts per node with shared MCP servers: `python -m bench.shared_density [--rollouts 10000]`.

Starts the dev server (SQLite file, as `gymflow server`), the benchmark policy endpoint and one
gymflow worker process (activity slots and workflow cache above the run's size), then starts
`--rollouts` rollouts of `bench-shared-mcp` (at most `--start-window` start calls in flight): a
stateless env whose `step` tool is an MCP server shared by every rollout of the worker
(`McpEnv.shared_servers`), with `--model-s` model turns and `--tool-turns` tool turns, on fused
turns. It counts the open rollouts every 3 s, waits for all to close, then reads every result:
each must have reward 1 (the others are listed under `failed`).

Figures: the peak of open rollouts, wall time, rollouts/s, rollout p50/p95 against the ideal; the
worker's and the dev server's peak RSS over their idle RSS, per open rollout at the peak; the MCP
server processes at the peak (one); CPU per rollout. Writes bench/results/shared_density.json and
its plot beside it (.png).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.procs import Procs, cpu_delta, load, start_policy, start_server, start_worker
from bench.scale import QUEUE, batch, sampled
from bench.scale_model import Workload
from bench.scenarios import pct
from bench.workload import SHARED_ENV_NAME, bench_task, endpoint
from gymflow.activities.model import ModelConfig
from gymflow.activities.names import ROLLOUT_WORKFLOW
from gymflow.activities.schema import RolloutInput, RolloutLimits, RolloutResult
from gymflow.workers.client import connect
from gymflow.workers.sdk import client as sdk

RESULTS = Path(__file__).parent / "results"


def servers_of(pid: int, marker: bytes = b"step_server.py") -> int:
    """Processes under `pid` (its whole tree) whose command line names the step server."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = 0, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            try:
                found += marker in Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
    return found


async def running(client: Client, prefix: str) -> int:
    """Rollouts of this run still open (visibility's count)."""
    query = f"WorkflowType = '{ROLLOUT_WORKFLOW}' AND ExecutionStatus = 'Running' AND WorkflowId STARTS_WITH '{prefix}'"
    return (await client.count_workflows(query)).count


async def held(client: Client, procs: Procs, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start `args.rollouts` rollouts (at most `args.start_window` start calls in flight: a burst of
    thousands of start RPCs times out on the dev server), wait for all to close, then check each."""
    prefix = f"density-{uuid.uuid4().hex[:6]}-"
    model = ModelConfig(base_url=endpoint(policy, args.model_s))
    limits = RolloutLimits(max_turns=args.tool_turns + 1)
    window = asyncio.Semaphore(args.start_window)
    started_at: dict[int, float] = {}

    async def start(i: int) -> None:
        task = bench_task(i, tool_turns=args.tool_turns)
        async with window:
            await sdk.start_rollout(
                client, RolloutInput(env=SHARED_ENV_NAME, task=task, model=model, limits=limits, fuse_turns=True),
                task_queue=QUEUE, workflow_id=f"{prefix}{i}",
            )  # fmt: skip
        started_at[i] = time.perf_counter()

    peak_open, peak_servers, open_series = 0, 0, []
    cpu_before = procs.cpu()
    async with sampled(procs, ["gymflow", "server"]) as memory:
        began = time.perf_counter()
        starting = asyncio.gather(*(start(i) for i in range(args.rollouts)))
        while True:
            await asyncio.sleep(3)
            now_open = await running(client, prefix)
            peak_open = max(peak_open, now_open)
            peak_servers = max(peak_servers, servers_of(procs.pids["gymflow"]))
            open_series.append((round(time.perf_counter() - began, 1), now_open))
            if starting.done() and now_open == 0:
                break
        await starting
        wall = time.perf_counter() - began
        all_started_s = max(started_at.values()) - began
    cpu = cpu_delta(cpu_before, procs.cpu())
    check = asyncio.Semaphore(32)
    durations: list[float] = []
    failed: list[str] = []

    async def result(i: int) -> None:
        async with check:
            handle = client.get_workflow_handle(f"{prefix}{i}", result_type=RolloutResult)
            trajectory = await handle.result()
            described = await handle.describe()
        if trajectory.infra_failed or trajectory.reward is None or trajectory.reward.total != 1.0:
            failed.append(f"{prefix}{i}: {trajectory.termination.value} {trajectory.error or ''}"[:200])
        if described.close_time is not None and described.start_time is not None:
            durations.append((described.close_time - described.start_time).total_seconds())

    await asyncio.gather(*(result(i) for i in range(args.rollouts)))
    return {
        "wall_s": round(wall, 1),
        "all_started_after_s": round(all_started_s, 1),
        "peak_open": peak_open,
        "open_series": open_series,
        "completed_with_reward_1": args.rollouts - len(failed),
        "failed": failed[:20],
        "rollouts_per_s": round(args.rollouts / wall, 2),
        "rollout_p50_s": round(pct(durations, 0.5), 1),
        "rollout_p95_s": round(pct(durations, 0.95), 1),
        "mcp_server_processes_at_peak": peak_servers,
        "memory": memory,
        "server_cpu_ms_per_rollout": round(cpu["server"] * 1000 / args.rollouts, 1),
        "worker_cpu_ms_per_rollout": round(cpu["gymflow"] * 1000 / args.rollouts, 1),
        "cores_used": round(sum(cpu.values()) / wall, 2),
        "load_after": load(),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gymflow-density-"))
    procs = Procs()
    try:
        address = await start_server(procs, work / "server", extra_args=[])
        room = str(args.rollouts + 1000)
        env = {"GYMFLOW_MAX_CONCURRENT_ACTIVITIES": room, "GYMFLOW_MAX_CACHED_WORKFLOWS": room}
        await start_worker(procs, "gymflow", mode="gymflow", address=address, task_queue=QUEUE, env=env)
        policy = await start_policy(procs)
        client = await connect(address)
        await batch(
            client, procs, policy, work / "server", label="warm-up", concurrency=16, rollouts=32,
            workload=Workload(args.tool_turns, args.model_s, 0.0), plan="fused", env=SHARED_ENV_NAME,
        )  # fmt: skip
        run = await held(client, procs, policy, args)
        memory = run["memory"]
        per_open = {
            role: round(
                (memory[f"{role}_rss_mb_peak"] - memory[f"{role}_rss_mb_before"]) * 1024 / max(run["peak_open"], 1), 1
            )
            for role in ("gymflow", "server")
        }
        return {
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "cpus": os.cpu_count(),
            "rollouts": args.rollouts,
            "model_s": args.model_s,
            "tool_turns": args.tool_turns,
            "kb_per_open_rollout": {"worker": per_open["gymflow"], "dev_server": per_open["server"]},
            "run": run,
        }
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = result["run"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    times, counts = zip(*run["open_series"], strict=True) if run["open_series"] else ((), ())
    ax.plot(times, counts)
    ax.set_xlabel("seconds")
    ax.set_ylabel("rollouts open")
    memory = run["memory"]
    ax.set_title(
        f"{result['rollouts']:,} rollouts, one shared MCP server: peak {run['peak_open']:,} open, "
        f"worker {memory['gymflow_rss_mb_peak']:.0f} MB, server {memory['server_rss_mb_peak']:.0f} MB",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000, help="rollouts started at once")
    parser.add_argument("--model-s", type=float, default=2.0, help="model latency per turn")
    parser.add_argument("--tool-turns", type=int, default=1, help="tool turns per rollout")
    parser.add_argument("--start-window", type=int, default=64, help="start calls in flight at most")
    parser.add_argument("--out", type=Path, default=RESULTS / "shared_density.json")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))  # the docs site shows bench/results/*.png
    summary = {k: v for k, v in result["run"].items() if k not in ("open_series", "memory")}
    print(json.dumps({**{k: v for k, v in result.items() if k != "run"}, "run": summary}, indent=1))


if __name__ == "__main__":
    main()
