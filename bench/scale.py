"""The scale model checked against this box: `python -m bench.scale [--held 1000 --held-model-s 40]`.

Starts the dev server (SQLite file, as `gymflow server`), the benchmark policy endpoint and one
gymflow worker process (activity slots and workflow cache raised above the held run's size), and
runs, one after another, the benchmark rollout (`bench.workload`, 4 tool turns):

* light — one rollout at a time, zero latency: the orchestration latency per round trip;
* throughput — 64 at a time, zero latency: CPU per rollout of server and worker, and how many
  cores the benchmark's processes got (the box is shared);
* realistic — 128 at once, model 2 s per turn, tool 100 ms (scenario (c) of bench.run);
* held — `--held` rollouts at once with a slow model (`--held-model-s` per turn): concurrency
  high, action rate moderate; the worker's memory per open rollout, the SQLite bytes per rollout.

For each: wall time, rollouts/s, activities and workflow tasks per second, CPU per process, the
worker's and server's peak RSS, schedule-to-start p50/p95 of activities and workflow tasks (from
every history), load average. The simulation (`bench.scale_model.simulate`) is calibrated on light
and throughput and predicts realistic and held, which were not used to calibrate it; then it and
the paper model size 1,000 and 10,000 concurrent rollouts (`bench.scale_report`). Writes
bench/out/scale.{json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client

from bench.procs import Procs, cpu_delta, load, start_policy, start_server, start_worker
from bench.scale_model import Workload
from bench.scale_report import OUT, report
from bench.scenarios import pct
from bench.workload import ENV_NAME, bench_task, endpoint
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput, RolloutLimits
from gymflow.workers.client import connect
from gymflow.workers.sdk import client as sdk

QUEUE = "bench-scale"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def db_bytes(data_dir: Path) -> int:
    """The dev server's SQLite database with its WAL (the server's log, in the same directory, excluded)."""
    return sum(f.stat().st_size for f in data_dir.glob("temporal.db*") if f.is_file())


@contextlib.asynccontextmanager
async def sampled(procs: Procs, roles: list[str], every_s: float = 1.0) -> AsyncIterator[dict[str, Any]]:
    """Peak RSS of `roles` and the peak 1-minute load average while the block runs."""
    record: dict[str, Any] = {f"{role}_rss_mb_before": round(rss_mb(procs.pids[role]), 1) for role in roles}
    peaks = {role: 0.0 for role in roles}
    top_load = 0.0

    async def sample() -> None:
        nonlocal top_load
        while True:
            for role in roles:
                peaks[role] = max(peaks[role], rss_mb(procs.pids[role]))
            top_load = max(top_load, os.getloadavg()[0])
            await asyncio.sleep(every_s)

    task = asyncio.create_task(sample())
    try:
        yield record
    finally:
        task.cancel()
        for role in roles:
            record[f"{role}_rss_mb_peak"] = round(peaks[role], 1)
        record["load1_peak"] = round(top_load, 2)


async def schedule_to_start(client: Client, workflow_ids: list[str]) -> dict[str, Any]:
    """Schedule-to-start latencies (ms) of every activity and workflow task of these rollouts; their counts,
    retried attempts (a retry shows only as the next attempt's number and last failure) and timeouts."""
    activity: list[float] = []
    wft: list[float] = []
    counts = {"activities": 0, "workflow_tasks": 0, "retried_attempts": 0, "heartbeat_timeouts": 0, "timeouts": 0}
    limit = asyncio.Semaphore(16)

    async def one(workflow_id: str) -> None:
        async with limit:
            history = await client.get_workflow_handle(workflow_id).fetch_history()
        scheduled: dict[int, float] = {}
        for event in history.events:
            at = event.event_time.ToMicroseconds() / 1000
            kind = event.event_type
            if kind in (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED):
                scheduled[event.event_id] = at
                key = "activities" if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED else "workflow_tasks"
                counts[key] += 1
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attrs = event.activity_task_started_event_attributes
                activity.append(at - scheduled[attrs.scheduled_event_id])  # the last attempt's
                counts["retried_attempts"] += max(0, attrs.attempt - 1)
                timeout = attrs.last_failure.timeout_failure_info.timeout_type if attrs.attempt > 1 else None
                counts["heartbeat_timeouts"] += timeout == TimeoutType.TIMEOUT_TYPE_HEARTBEAT
            elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                counts["timeouts"] += 1
            elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                wft.append(at - scheduled[event.workflow_task_started_event_attributes.scheduled_event_id])

    await asyncio.gather(*(one(w) for w in workflow_ids))
    return {
        **counts,
        "activity_p50_ms": round(pct(activity, 0.5), 1),
        "activity_p95_ms": round(pct(activity, 0.95), 1),
        "workflow_task_p50_ms": round(pct(wft, 0.5), 1),
        "workflow_task_p95_ms": round(pct(wft, 0.95), 1),
    }


async def batch(
    client: Client,
    procs: Procs,
    policy: str,
    db_dir: Path,
    *,
    label: str,
    concurrency: int,
    rollouts: int,
    workload: Workload,
    plan: str,
    env: str = ENV_NAME,
    latencies: bool = True,
) -> dict[str, Any]:
    """`rollouts` rollouts, `concurrency` at a time; the figures of the batch."""
    model = ModelConfig(base_url=endpoint(policy, workload.model_s), local_activity=plan == "local")
    limits = RolloutLimits(max_turns=workload.tool_turns + 1)
    window = asyncio.Semaphore(concurrency)
    durations: list[float] = []
    ids = [f"scale-{label}-{i}" for i in range(rollouts)]

    async def one(i: int) -> None:
        task = bench_task(i, tool_turns=workload.tool_turns, tool_delay_s=workload.tool_s)
        async with window:
            started = time.perf_counter()
            result = await sdk.run_rollout(
                client, RolloutInput(env=env, task=task, model=model, limits=limits, fuse_turns=plan == "fused"),
                task_queue=QUEUE, workflow_id=ids[i],
            )  # fmt: skip
            durations.append(time.perf_counter() - started)
        if result.reward is None or result.reward.total != 1.0:
            raise RuntimeError(f"{label}: rollout {i} did not finish as expected: {result.termination}")

    db_before = db_bytes(db_dir)
    record: dict[str, Any] = {"label": label, "plan": plan, "concurrency": concurrency, "rollouts": rollouts}
    record["workload"] = {"tool_turns": workload.tool_turns, "model_s": workload.model_s, "tool_s": workload.tool_s}
    record["load_before"] = load()
    cpu_before = procs.cpu()
    async with sampled(procs, ["gymflow", "server"]) as memory:
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(rollouts)))
        wall = time.perf_counter() - started
    cpu = cpu_delta(cpu_before, procs.cpu())
    record |= {"wall_s": round(wall, 2), "load_after": load(), "cpu_s": cpu, "memory": memory}
    record["db_bytes_per_rollout"] = round((db_bytes(db_dir) - db_before) / rollouts)
    record["rollouts_per_s"] = round(rollouts / wall, 3)
    record["server_cpu_ms_per_rollout"] = round(cpu["server"] * 1000 / rollouts, 1)
    record["worker_cpu_ms_per_rollout"] = round(cpu["gymflow"] * 1000 / rollouts, 1)
    if latencies:  # every history read back: minutes for thousands of rollouts
        record["schedule_to_start"] = latency = await schedule_to_start(client, ids)
        record["activities_per_s"] = round(latency["activities"] / wall, 1)
        record["workflow_tasks_per_s"] = round(latency["workflow_tasks"] / wall, 1)
        record["server_cpu_ms_per_activity"] = round(cpu["server"] * 1000 / latency["activities"], 2)
    record["cores_used"] = round(sum(cpu.values()) / wall, 2)
    record["rollout_p50_s"] = round(statistics.median(durations), 2)
    record["rollout_p95_s"] = round(pct(durations, 0.95), 2)
    record["ideal_s"] = workload.ideal_s
    print(label, json.dumps({k: v for k, v in record.items() if k not in ("cpu_s", "load_before")}), flush=True)
    return record


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gymflow-scale-"))
    procs = Procs()
    try:
        address = await start_server(procs, work / "server", extra_args=[])
        room = str(max(2 * args.held, 1000))
        env = {"GYMFLOW_MAX_CONCURRENT_ACTIVITIES": room, "GYMFLOW_MAX_CACHED_WORKFLOWS": room}
        await start_worker(procs, "gymflow", mode="gymflow", address=address, task_queue=QUEUE, env=env)
        policy = await start_policy(procs)
        client = await connect(address)
        runs: dict[str, Any] = {}
        plan = [
            ("warm-up", 16, 32, Workload(4, 0.0, 0.0)),
            ("light", 1, args.light, Workload(4, 0.0, 0.0)),
            ("throughput", 64, args.throughput, Workload(4, 0.0, 0.0)),
            ("realistic", 128, 128, Workload(4, 2.0, 0.1)),
            ("held", args.held, args.held, Workload(4, args.held_model_s, 0.1)),
        ]
        for label, concurrency, rollouts, workload in plan:
            if label in args.skip:
                continue
            runs[label] = await batch(
                client, procs, policy, work / "server", label=label, concurrency=concurrency, rollouts=rollouts,
                workload=workload, plan=args.plan,
            )  # fmt: skip
        runs.pop("warm-up", None)
        return {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "plan": args.plan, "runs": runs}
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=1000, help="rollouts held open at once")
    parser.add_argument("--held-model-s", type=float, default=40.0, help="model latency per turn of the held run")
    parser.add_argument("--light", type=int, default=8, help="rollouts of the one-at-a-time run")
    parser.add_argument("--throughput", type=int, default=256, help="rollouts of the saturation run")
    parser.add_argument("--plan", choices=["classic", "local", "fused"], default="classic",
                        help="rollout plan of every run (bench.actions.PLANS); the sizing's per-transition cost "
                        "comes from this plan's throughput run")  # fmt: skip
    parser.add_argument("--skip", nargs="*", default=[], help="runs to leave out (e.g. held)")
    parser.add_argument("--from-json", type=Path, help="re-model a previous scale.json's measured runs")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    report(json.loads(args.from_json.read_text())["measured"] if args.from_json else asyncio.run(measure(args)))


if __name__ == "__main__":
    main()
