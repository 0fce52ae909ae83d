"""Run every benchmark side by side and write bench/out/bench.{json,png}: `python -m bench.run [--quick]`.

One run starts a dev server (as `gymflow server` does: SQLite file, headless), the benchmark
policy endpoint, a gymflow worker and a bare-Temporal worker, each in its own process. Runners:
direct (plain asyncio), bare and bare+local (the bare-Temporal ceiling with gymflow's activity
plan, model turns as regular or local activities), gymflow and gymflow+local. It runs:

(a) light load — one rollout at a time, 20 zero-latency tool turns: latency each activity adds
    over the direct asyncio loop;
(b) saturation — many concurrent zero-latency rollouts: activity-steps per second, gymflow vs the
    bare-Temporal ceiling with the same plan (and direct);
(c) realistic RL load — model 2 s per turn, tool 100 ms, 4 tool turns, 128 rollouts at once:
    wall time vs direct and vs bare Temporal with the same latencies;
(d) MCP isolation — warm-pool vs cold init, isolated calculator servers held at once and memory
    per server (`bench/mcp_isolation.py`).

`--variant LABEL=GIT_REF` adds a gymflow worker running another commit's code (a checkout made
with `git worktree`), for before/after comparisons in the same run; `--variant LABEL=:VAR=VALUE,...`
runs the current code with other GYMFLOW_* settings. `--profile` samples the bare and the (last)
gymflow worker with py-spy during their first (b) run (bench/out/profile_<runner>.txt, collapsed
stacks; `python -m bench.profile FILE` summarises one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import mcp_isolation  # noqa: E402
from bench.direct import DirectRunner  # noqa: E402
from bench.procs import Procs, fresh_servers, load, start_policy, start_server, start_worker  # noqa: E402
from bench.report import plot, summary_table, targets  # noqa: E402
from bench.scenarios import (  # noqa: E402
    BARE,
    BARE_FUSED,
    BARE_LOCAL,
    BARE_WORK,
    BARE_WORK_RUNNER,
    CLASSIC,
    DIRECT,
    FUSED,
    LOCAL,
    LOCAL_PLAN,
    Bench,
    Runner,
    light,
    realistic,
    saturation,
)
from bench.worker import BARE_RUNNER_VAR  # noqa: E402
from bench.workload import BenchEnv  # noqa: E402
from gymflow.workers.client import connect  # noqa: E402

OUT = ROOT / "bench" / "out"

FULL: dict[str, dict[str, Any]] = {
    "a": {"tool_turns": 20, "rollouts": 15},
    "b": {"tool_turns": 10, "concurrency": 64, "rollouts": 256, "repeats": 2},
    "c": {"tool_turns": 4, "concurrency": 128, "model_s": 2.0, "tool_s": 0.1, "repeats": 2},
    "d": {"servers": 200, "samples": 30},
}
QUICK: dict[str, dict[str, Any]] = {
    "a": {"tool_turns": 20, "rollouts": 5},
    "b": {"tool_turns": 10, "concurrency": 64, "rollouts": 128, "repeats": 1},
    "c": {"tool_turns": 4, "concurrency": 128, "model_s": 2.0, "tool_s": 0.1, "repeats": 1},
    "d": {"servers": 24, "samples": 10},
}


def parse_variant(text: str) -> tuple[str, str | None, dict[str, str]]:
    label, _, spec = text.partition("=")
    if spec.startswith(":"):
        env = dict(pair.split("=", 1) for pair in spec[1:].split(",") if pair)
        return label, None, env
    return label, spec, {}


def checkout(ref: str, into: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", str(into), ref], cwd=ROOT, check=True, capture_output=True)
    return into


def remove_checkouts(trees: list[Path]) -> None:
    for tree in trees:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


async def start_runners(
    args: argparse.Namespace, procs: Procs, work: Path, trees: list[Path]
) -> tuple[str, list[Runner]]:
    """Server, bare worker and one gymflow worker per variant; returns the server address and the runners."""
    address = await start_server(procs, work / "server", extra_args=args.server_arg)
    runners = [
        Runner(DIRECT, DIRECT),
        Runner(BARE, BARE, "bench-bare"),
        Runner(BARE_LOCAL, BARE, "bench-bare", plan=LOCAL_PLAN),
        Runner(BARE_FUSED, BARE, "bench-bare", plan=FUSED),
        Runner(BARE_WORK, BARE, "bench-bare", plan=FUSED, work=True),
        Runner(BARE_WORK_RUNNER, BARE, "bench-bare-runner", plan=FUSED, work=True),
    ]
    await start_worker(procs, BARE, mode="bare", address=address, task_queue="bench-bare")
    if not args.runners or BARE_WORK_RUNNER in args.runners:  # a second bare worker, in gymflow's runner
        queue, gymflow_runner = "bench-bare-runner", {BARE_RUNNER_VAR: "gymflow"}
        await start_worker(procs, "bare-runner", mode="bare", address=address, task_queue=queue, env=gymflow_runner)
    for label, ref, env in [parse_variant(v) for v in args.variant] or [("gymflow", None, {})]:
        code_root = None
        if ref is not None:
            code_root = checkout(ref, work / f"tree-{label}")
            trees.append(code_root)
        queue = f"bench-{label}"
        await start_worker(
            procs, label, mode="gymflow", address=address, task_queue=queue, env=env, code_root=code_root
        )
        runners.append(Runner(label, "gymflow", queue, plan=FUSED))
    # The current code once more on the classic plan, and with model turns as local activities.
    last = runners[-1]
    runners.append(Runner(f"{last.label}+classic", "gymflow", last.task_queue, plan=CLASSIC))
    runners.append(Runner(f"{last.label}+local", LOCAL, last.task_queue, plan=LOCAL_PLAN))
    if args.runners:
        runners = [r for r in runners if r.label in args.runners or r.kind == DIRECT]
    return address, runners


async def run_scenarios(args: argparse.Namespace, sizes: dict[str, Any], report: dict[str, Any]) -> None:
    """(a), (b) and (c), side by side, each in the processes this starts and stops."""
    work = Path(tempfile.mkdtemp(prefix="gymflow-bench-"))
    trees: list[Path] = []
    procs = Procs()
    try:
        address, runners = await start_runners(args, procs, work, trees)
        policy = await start_policy(procs)
        report["runners"] = {r.label: r.kind for r in runners}
        report["plans"] = {r.label: r.plan for r in runners}
        report["variants"] = [parse_variant(v) for v in args.variant]
        bench = Bench(
            client=await connect(address),
            procs=procs,
            policy_base=policy,
            direct=DirectRunner(BenchEnv(workspace_root=work / "direct-ws")),
        )
        if not args.same_server:
            bench.fresh_server = fresh_servers(procs, work, address, extra_args=args.server_arg)
        if args.profile:
            last = [r.label for r in runners if r.kind == "gymflow" and r.plan == FUSED][-1]
            bench.profile = {label: OUT / f"profile_{label}.txt" for label in (BARE, last)}
        try:
            if "a" in args.only:
                report["scenarios"]["a"] = await light(bench, runners, **sizes["a"])
                print("(a)", json.dumps(report["scenarios"]["a"]["runners"]), flush=True)
            if "b" in args.only:
                report["scenarios"]["b"] = await saturation(bench, runners, **sizes["b"])
                print("(b)", json.dumps(report["scenarios"]["b"]["runners"]), flush=True)
            if "c" in args.only:
                report["scenarios"]["c"] = await realistic(bench, runners, **sizes["c"])
                print("(c)", json.dumps(report["scenarios"]["c"]["runners"]), flush=True)
        finally:
            await bench.direct.aclose()
    finally:
        procs.stop_all()
        remove_checkouts(trees)
        shutil.rmtree(work, ignore_errors=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = {name: dict(values) for name, values in (QUICK if args.quick else FULL).items()}
    if args.repeats is not None:
        for name in ("b", "c"):
            sizes[name]["repeats"] = args.repeats
    report: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "load_at_start": load()},
        "server_args": args.server_arg,
        "fresh_server_per_run": not args.same_server,
        "sizes": sizes,
        "scenarios": {},
    }
    if set(args.only) & {"a", "b", "c"}:
        await run_scenarios(args, sizes, report)
    if "d" in args.only:
        report["scenarios"]["d"] = await mcp(sizes["d"], with_layers=not args.quick)
        print("(d)", json.dumps(report["scenarios"]["d"]["summary"]), flush=True)
    report["machine"]["load_at_end"] = load()
    report["targets"] = targets(report)
    return report


async def mcp(sizes: dict[str, int], *, with_layers: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gymflow-bench-mcp-"))
    try:
        latency = await mcp_isolation.init_latency(root, sizes["samples"])
        capacity = await mcp_isolation.capacity(root, sizes["servers"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {"init_latency": latency, "capacity": capacity, "load": load()}
    if with_layers:
        result["profile"] = {"import_layers": mcp_isolation.layer_profile()}
    result["summary"] = {
        "warm_p50_ms": latency["warm_pool"]["p50_ms"],
        "warm_p95_ms": latency["warm_pool"]["p95_ms"],
        "cold_p50_ms": latency["cold"]["p50_ms"],
        "cold_p95_ms": latency["cold"]["p95_ms"],
        "servers_held": capacity["held_concurrently"],
        "all_answered": capacity["all_answered_while_all_up"],
        "pss_mb": capacity["server_pss_mb"]["median"],
        "rss_mb": capacity["server_rss_mb"]["median"],
        "mem_available_after_gb": capacity["mem_available_after_gb"],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, one repeat (~3 minutes)")
    parser.add_argument("--only", nargs="+", default=["a", "b", "c", "d"], choices=["a", "b", "c", "d"])
    parser.add_argument("--variant", action="append", default=[], help="LABEL=GIT_REF or LABEL=:VAR=VALUE,...")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `temporal server start-dev` args")
    parser.add_argument(
        "--same-server",
        action="store_true",
        help="(b) and (c) on one server throughout, as before: later runs meet a larger database",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the (last) gymflow worker")
    parser.add_argument("--runners", nargs="+", default=[], help="only these runners (labels; direct always runs)")
    parser.add_argument("--repeats", type=int, help="runs of each runner in (b) and (c) (default 2; quick 1)")
    parser.add_argument("--out", default="bench", help="name of the JSON/PNG files under bench/out/")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run(args))
    (OUT / f"{args.out}.json").write_text(json.dumps(report, indent=2))
    plot(report, OUT / f"{args.out}.png")
    if "d" in report["scenarios"]:
        mcp_isolation.plot(report["scenarios"]["d"], OUT / "mcp_isolation.png")
    print(summary_table(report))
    print(f"wrote {OUT / (args.out + '.json')} and {OUT / (args.out + '.png')}")


if __name__ == "__main__":
    main()
