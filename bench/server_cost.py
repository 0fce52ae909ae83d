"""What the Temporal server's CPU per rollout goes to: `python -m bench.server_cost [--rollouts N]`.

At saturation (scenario (b)) the dev server, not the worker, uses most of the machine, and it
spent more CPU per gymflow rollout than per bare-Temporal rollout of the same activity plan. This
runs the bare workflow with RolloutWorkflow's extras switched on one at a time (a patch marker, search
attributes and memo set at start, upserts at the end, payloads growing with the conversation), then
all of them, then gymflow itself — alternating, `--repeats` times — and reports the server's CPU
milliseconds per rollout (median and every run) and the history bytes of each:
bench/out/server_cost.json (`--plan fused`: both on fused turns, bench/out/server_cost_fused.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from bench.bare import BARE_WORKFLOW, BareInput
from bench.direct import DirectRunner
from bench.procs import Procs, fresh_servers, profiled, start_bare_and_gymflow
from bench.scenarios import BARE_WORK, CLASSIC, FUSED, Bench, Runner
from bench.workload import BenchEnv
from gymflow.activities.names import ROLLOUT_WORKFLOW, SA_ENV, SA_MODEL

OUT = Path(__file__).resolve().parent / "out"
TOOL_TURNS = 10
WORK = "+work"
"""Fused plan: the bare turns do the rollout's work (the model call, the tool, the reward), as
`bench.scenarios.BARE_WORK` does: the worker's CPU to compare with gymflow's."""
PAD_BYTES = 180
"""Input bytes per turn so far: makes the bare history about as large as gymflow's bench rollout."""


def variants(fused: bool = False) -> dict[str, tuple[BareInput, bool]]:
    """Label -> (bare input, whether the starter sets search attributes and memo); `fused`: one
    activity per turn, as gymflow's fused turns."""
    plain = BareInput(TOOL_TURNS, fused=fused)
    every = replace(plain, patch=True, finish_upserts=True, pad_bytes=PAD_BYTES, node_timeouts=fused)
    timeouts = {"+node timeouts": (replace(plain, node_timeouts=True), False)} if fused else {}
    return {
        "bare": (plain, False),
        **timeouts,
        "+patch": (replace(plain, patch=True), False),
        "+start attributes": (plain, True),
        "+end upserts": (replace(plain, finish_upserts=True), False),
        "+payloads": (replace(plain, pad_bytes=PAD_BYTES), False),
        "all of them": (every, True),
    }


async def bare_rollout(client: Client, plan: BareInput, start_attributes: bool) -> str:
    workflow_id = f"cost-{uuid.uuid4().hex}"
    extra: dict[str, Any] = {}
    if start_attributes:
        pairs = [SearchAttributePair(SA_ENV, "bench"), SearchAttributePair(SA_MODEL, "default")]
        extra = {"search_attributes": TypedSearchAttributes(pairs), "memo": {"task_id": "t"}}
    await client.execute_workflow(BARE_WORKFLOW, plan, id=workflow_id, task_queue="bench-bare", **extra)
    return workflow_id


async def history_bytes(client: Client, workflow_id: str) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return sum(event.ByteSize() for event in history.events)


async def measure(
    bench: Bench, label: str, one: Callable[[], Awaitable[str]], *, rollouts: int, concurrency: int
) -> dict[str, Any]:
    workflow_type = ROLLOUT_WORKFLOW if worker_role(label) == "gymflow" else BARE_WORKFLOW
    semaphore = asyncio.Semaphore(concurrency)
    ids: list[str] = []

    async def run() -> None:
        async with semaphore:
            ids.append(await one())

    if bench.fresh_server is not None:
        await bench.fresh_server()
    await asyncio.gather(*(run() for _ in range(min(concurrency, rollouts))))  # warm-up
    before = bench.procs.cpu()
    started = time.perf_counter()
    await asyncio.gather(*(run() for _ in range(rollouts)))
    wall = time.perf_counter() - started
    after = bench.procs.cpu()
    cpu = {role: after[role] - before[role] for role in after}
    row = {
        "server_ms_per_rollout": round(cpu["server"] * 1000 / rollouts, 1),
        "policy_ms_per_rollout": round(cpu.get("policy", 0) * 1000 / rollouts, 1),
        "worker_ms_per_rollout": round(max(cpu.get("bare", 0), cpu.get("gymflow", 0)) * 1000 / rollouts, 1),
        "rollouts_per_s": round(rollouts / wall, 2),
        "history_bytes": await history_bytes(bench.client, ids[-1] or await any_rollout(bench.client, workflow_type)),
    }
    print(label, json.dumps(row), flush=True)
    return row


def worker_role(label: str) -> str:
    """The process (bench.procs role) whose worker runs `label`'s rollouts."""
    return "gymflow" if label == "gymflow" else "bare"


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label.strip("+"))


async def run(
    rollouts: int,
    concurrency: int,
    repeats: int,
    plan: str = CLASSIC,
    *,
    fresh: bool = True,
    only: Sequence[str] = (),
    profile: Path | None = None,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gymflow-cost-"))
    procs = Procs()
    try:
        policy, client = await start_bare_and_gymflow(procs, work)
        bench = Bench(client, procs, policy, DirectRunner(BenchEnv(workspace_root=work / "direct")))
        if fresh:
            bench.fresh_server = fresh_servers(procs, work, client.service_client.config.target_host, extra_args=[])
        runs: dict[str, Callable[[], Awaitable[str]]] = {}
        plans = variants(plan == FUSED)
        for label, (bare, start_attributes) in plans.items():

            async def one(bare: BareInput = bare, start_attributes: bool = start_attributes) -> str:
                return await bare_rollout(client, bare, start_attributes)

            runs[label] = one
        gymflow = Runner("gymflow", "gymflow", "bench-gymflow", plan=plan)
        with_work = Runner(BARE_WORK, "bare", "bench-bare", plan=FUSED, work=True)

        def through_bench(runner: Runner) -> Callable[[], Awaitable[str]]:
            async def one() -> str:
                await bench.rollout(runner, 0, tool_turns=TOOL_TURNS, model_s=0, tool_s=0)
                return ""  # the SDK picks the id; any_rollout finds one

            return one

        if plan == FUSED:
            runs[WORK] = through_bench(with_work)
        runs["gymflow"] = through_bench(gymflow)
        runs = {label: one for label, one in runs.items() if not only or label in only}
        measured: dict[str, list[dict[str, Any]]] = {label: [] for label in runs}
        labels = list(runs)
        for repeat in range(repeats):  # alternating, each repeat starting one variant later
            shift = repeat % len(labels)
            for label in [*labels[shift:], *labels[:shift]]:
                spied = profile and profile / f"cost_{slug(label)}_{repeat}.txt"
                with profiled(procs.pids.get(worker_role(label)), spied):
                    row = await measure(bench, label, runs[label], rollouts=rollouts, concurrency=concurrency)
                measured[label].append(row)
        rows: dict[str, Any] = {}
        for label, records in measured.items():
            server = [r["server_ms_per_rollout"] for r in records]
            rows[label] = {
                "server_ms_per_rollout_median": statistics.median(server),
                "server_ms_per_rollout_all": server,
                "worker_ms_per_rollout_median": statistics.median(r["worker_ms_per_rollout"] for r in records),
                "rollouts_per_s_median": statistics.median(r["rollouts_per_s"] for r in records),
                "history_bytes": records[-1]["history_bytes"],
            }
            if label in plans:
                rows[label] |= {"input": asdict(plans[label][0]), "start_attributes": plans[label][1]}
        await bench.direct.aclose()
        return {
            "plan": plan,
            "tool_turns": TOOL_TURNS,
            "rollouts": rollouts,
            "concurrency": concurrency,
            "repeats": repeats,
            "fresh_server_per_run": fresh,
            "variants": rows,
        }
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


async def any_rollout(client: Client, workflow_type: str) -> str:
    async for execution in client.list_workflows(f"WorkflowType = '{workflow_type}'", limit=1):
        return execution.id
    raise RuntimeError("no rollout found")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--plan", choices=[CLASSIC, FUSED], default=CLASSIC, help="the bare and gymflow plan")
    parser.add_argument("--same-server", action="store_true", help="every run on one server (its database grows)")
    parser.add_argument("--only", nargs="+", default=[], help="measure only these variants (labels as printed)")
    parser.add_argument("--profile", type=Path, help="py-spy each run's worker into DIR/cost_<variant>_<repeat>.txt")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(
        run(
            args.rollouts,
            args.concurrency,
            args.repeats,
            args.plan,
            fresh=not args.same_server,
            only=args.only,
            profile=args.profile,
        )
    )
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / ("server_cost.json" if args.plan == CLASSIC else f"server_cost_{args.plan}.json")
    out.write_text(json.dumps(report, indent=2))
    for label, row in report["variants"].items():
        print(f"{label:18s} server {row['server_ms_per_rollout_median']:6.1f} ms/rollout (runs: "
              f"{row['server_ms_per_rollout_all']}), worker {row['worker_ms_per_rollout_median']:6.1f}, "
              f"{row['rollouts_per_s_median']:6.1f} rollouts/s, "
              f"history {row['history_bytes']} B")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
