"""Where a rollout's time goes, from its history: `python -m bench.phases [--rollouts N]`.

Starts a dev server, the benchmark endpoint, a bare-Temporal worker and a gymflow worker (as
`bench.run` does), runs one zero-latency rollout at a time on the fused plan for each, then reads
every rollout's history and splits each turn's wall time by the server's event timestamps into:

* activity dispatch: ActivityTaskScheduled -> ActivityTaskStarted (the worker polls it up);
* activity run: Started -> Completed (the worker's activity code, its payload conversion, the
  bridge's completion call);
* workflow task dispatch: WorkflowTaskScheduled -> WorkflowTaskStarted;
* workflow task run: Started -> Completed (activation, the workflow code, the commands back).

Prints median milliseconds per turn for each runner and their difference (JSON on stdout), the
evidence for which side of the worker gymflow's per-activity overhead sits on; also written to
bench/out/phases.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client, WorkflowHandle  # noqa: E402

from bench.bare import BARE_WORKFLOW, BareInput  # noqa: E402
from bench.procs import Procs, profiled, start_bare_and_gymflow  # noqa: E402
from bench.workload import ENV_NAME, bench_task, endpoint  # noqa: E402
from gymflow.activities.model import ModelConfig  # noqa: E402
from gymflow.activities.schema import RolloutInput, RolloutLimits  # noqa: E402
from gymflow.workers.sdk import client as sdk  # noqa: E402

OUT = ROOT / "bench" / "out"
PHASES = {
    "activity_dispatch": (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED),
    "activity_run": (EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
    "wft_dispatch": (EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED),
    "wft_run": (EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
}


async def phases(handle: WorkflowHandle[Any, Any]) -> dict[str, list[float]]:
    """Milliseconds of every occurrence of each phase in the workflow's history."""
    out: dict[str, list[float]] = {name: [] for name in PHASES}
    out["history_kb"] = [0.0]
    open_at: dict[int, float] = {}
    async for event in handle.fetch_history_events():
        out["history_kb"][0] += event.ByteSize() / 1024
        at = event.event_time.ToDatetime().timestamp()
        open_at[event.event_type] = at
        for name, (start, end) in PHASES.items():
            if event.event_type == end and start in open_at:
                out[name].append((at - open_at.pop(start)) * 1000)
    return out


async def measure(client: Client, policy: str, *, tool_turns: int, rollouts: int, pad_bytes: int = 0) -> dict[str, Any]:
    results: dict[str, dict[str, list[float]]] = {"bare+fused": {}, "gymflow": {}}
    walls: dict[str, list[float]] = {label: [] for label in results}
    client_walls: dict[str, list[float]] = {label: [] for label in results}
    for i in range(rollouts + 2):  # two warm-up rollouts each
        handles: dict[str, WorkflowHandle[Any, Any]] = {}
        started: dict[str, float] = {}
        bare = BareInput(tool_turns, fused=True, pad_bytes=pad_bytes)
        started["bare+fused"] = time.perf_counter()
        handles["bare+fused"] = await client.start_workflow(
            BARE_WORKFLOW, bare, id=f"bare-{uuid.uuid4().hex}", task_queue="bench-bare"
        )
        await handles["bare+fused"].result()
        started["bare+fused"] = time.perf_counter() - started["bare+fused"]
        task = bench_task(i, tool_turns=tool_turns)
        rollout = RolloutInput(
            env=ENV_NAME,
            task=task,
            model=ModelConfig(base_url=endpoint(policy, 0)),
            limits=RolloutLimits(max_turns=tool_turns + 1),
        )
        started["gymflow"] = time.perf_counter()
        handles["gymflow"] = await sdk.start_rollout(client, rollout, task_queue="bench-gymflow")
        await handles["gymflow"].result()
        started["gymflow"] = time.perf_counter() - started["gymflow"]
        if i < 2:
            continue
        for label, handle in handles.items():
            described = await handle.describe()
            assert described.close_time and described.start_time
            client_walls[label].append(started[label] * 1000)
            walls[label].append((described.close_time - described.start_time).total_seconds() * 1000)
            for name, values in (await phases(handle)).items():
                results[label].setdefault(name, []).extend(values)  # history_kb: one value per rollout
    summary: dict[str, Any] = {"tool_turns": tool_turns, "rollouts": rollouts, "runners": {}}
    for label, by_phase in results.items():
        summary["runners"][label] = {
            "client_p50_ms": round(statistics.median(client_walls[label]), 1),
            "rollout_p50_ms": round(statistics.median(walls[label]), 1),
            "history_kib": round(statistics.median(by_phase.pop("history_kb")), 1),
            **{f"{name}_p50_ms": round(statistics.median(v), 2) for name, v in by_phase.items()},
            **{f"{name}_total_ms": round(sum(v) / rollouts, 1) for name, v in by_phase.items()},
        }
    return summary


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gymflow-phases-"))
    procs = Procs()
    try:
        policy, client = await start_bare_and_gymflow(procs, work)
        profile = args.profile
        with (
            profiled(procs.pids.get("gymflow"), profile and profile / "phases_gymflow.txt"),
            profiled(procs.pids.get("bare"), profile and profile / "phases_bare.txt"),
        ):
            return await measure(client, policy, tool_turns=args.tool_turns, rollouts=args.rollouts, pad_bytes=args.pad)
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool-turns", type=int, default=20)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--pad", type=int, default=0, help="bytes the bare workflow adds to each turn's input per turn")
    parser.add_argument("--profile", type=Path, help="py-spy both workers into DIR/phases_{gymflow,bare}.txt")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "phases.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    print(f"wrote {OUT / 'phases.json'}")


if __name__ == "__main__":
    main()
