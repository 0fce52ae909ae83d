"""`rollout_groups` throughput under the realistic RL load, beside direct asyncio and bare Temporal.

`python -m bench.groups [--quick]` writes bench/out/groups.{json,png}. One run starts the dev
server, the benchmark policy endpoint, a gymflow worker and a bare-Temporal worker (bench.procs,
as `bench.run` does), then runs the realistic load of scenario (c) — model 2 s per turn, tool
100 ms, 4 tool turns, 128 rollouts at once — four ways, alternating (bench.scenarios.side_by_side):

* ``direct``: 128 rollouts as plain asyncio tasks (no Temporal);
* ``bare``: 128 workflows with gymflow's activity plan and nothing else (the Temporal ceiling);
* ``gymflow``: 128 RolloutWorkflows started one by one (`run_rollout`);
* ``rollout_groups``: the trainer SDK, 16 tasks x n=8 as GRPO groups (`GymflowClient.rollout_groups`,
  all 16 groups in flight), each group yielded with its advantages as it finishes.

Reported per runner: the batch's wall time, rollouts per second, the ratios to direct and bare,
and the CPU seconds the Temporal server and the worker spent (steadier than wall time when other
processes load the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.direct import DirectRunner  # noqa: E402
from bench.procs import Procs, load, start_policy, start_server, start_worker  # noqa: E402
from bench.scenarios import BARE, DIRECT, Bench, Runner, batch, side_by_side  # noqa: E402
from bench.workload import ENV_NAME, BenchEnv, bench_task, endpoint  # noqa: E402
from gymflow.activities.model import ModelConfig  # noqa: E402
from gymflow.activities.schema import RolloutLimits, RolloutOptions  # noqa: E402
from gymflow.workers.client import connect  # noqa: E402
from gymflow.workers.sdk.groups import GymflowClient  # noqa: E402

OUT = ROOT / "bench" / "out"
GROUPS = "rollout_groups"
LOAD = {"tool_turns": 4, "model_s": 2.0, "tool_s": 0.1, "groups": 16, "n": 8}


async def run_groups(
    bench: Bench, queue: str, *, groups: int, n: int, tool_turns: int, model_s: float, tool_s: float
) -> float:
    """All groups through `rollout_groups`; returns the wall seconds until the last one is yielded."""
    client = GymflowClient(bench.client, env=ENV_NAME, task_queue=queue)
    options = RolloutOptions(
        model=ModelConfig(base_url=endpoint(bench.policy_base, model_s)), limits=RolloutLimits(max_turns=tool_turns + 1)
    )
    tasks = [bench_task(i, tool_turns=tool_turns, tool_delay_s=tool_s) for i in range(groups)]
    started = time.perf_counter()
    seen = 0
    async for group in client.rollout_groups(tasks, n=n, options=options, max_in_flight=groups):
        if group.infra_failed or group.rewards != [1.0] * n:
            raise RuntimeError(f"group {group.group_id} did not finish as expected: {group.rewards}")
        seen += 1
    if seen != groups:
        raise RuntimeError(f"{seen} groups of {groups}")
    return time.perf_counter() - started


async def run(quick: bool) -> dict[str, Any]:
    size: dict[str, Any] = dict(LOAD, repeats=1 if quick else 2)
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "load": size, "load_at_start": load()}
    work = Path(tempfile.mkdtemp(prefix="gymflow-bench-groups-"))
    procs = Procs()
    try:
        address = await start_server(procs, work / "server", extra_args=[])
        await start_worker(procs, BARE, mode="bare", address=address, task_queue="bench-bare")
        await start_worker(procs, "gymflow", mode="gymflow", address=address, task_queue="bench-gymflow")
        bench = Bench(
            client=await connect(address),
            procs=procs,
            policy_base=await start_policy(procs),
            direct=DirectRunner(BenchEnv(workspace_root=work / "direct-ws")),
        )
        runners = [
            Runner(DIRECT, DIRECT),
            Runner(BARE, BARE, "bench-bare"),
            Runner("gymflow", "gymflow", "bench-gymflow"),
            Runner(GROUPS, GROUPS, "bench-gymflow"),
        ]
        rollouts = size["groups"] * size["n"]
        work_args = {"tool_turns": size["tool_turns"], "model_s": size["model_s"], "tool_s": size["tool_s"]}

        async def one(runner: Runner) -> float:
            if runner.kind == GROUPS:
                return await run_groups(bench, "bench-gymflow", groups=size["groups"], n=size["n"], **work_args)
            return await batch(bench, runner, rollouts=rollouts, concurrency=rollouts, **work_args)

        async def warm_up(runner: Runner) -> float:  # connections, imports, caches
            if runner.kind == GROUPS:
                return await run_groups(bench, "bench-gymflow", groups=2, n=2, tool_turns=1, model_s=0, tool_s=0)
            return await batch(bench, runner, rollouts=4, concurrency=4, tool_turns=1, model_s=0, tool_s=0)

        try:
            raw = await side_by_side(bench, runners, repeats=size["repeats"], run=one, warm_up=warm_up)
        finally:
            await bench.direct.aclose()
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    rows = {}
    for label, records in raw.items():
        wall = min(r["batch_wall_s"] for r in records)
        # CPU of the Temporal server and the worker per run: steadier than wall time on a loaded box.
        cpu = [round(sum(v for k, v in r["cpu_s"].items() if k in ("server", BARE, "gymflow")), 2) for r in records]
        rows[label] = {
            "wall_s": round(wall, 2),
            "rollouts_per_s": round(rollouts / wall, 2),
            "server_worker_cpu_s": min(cpu),
            "cpu_ms_per_rollout": round(min(cpu) * 1000 / rollouts, 1),
        }
    for row in rows.values():
        row["vs_direct"] = round(row["wall_s"] / rows[DIRECT]["wall_s"], 3)
        row["vs_bare"] = round(row["wall_s"] / rows[BARE]["wall_s"], 3)
    ideal = (size["tool_turns"] + 1) * size["model_s"] + size["tool_turns"] * size["tool_s"]
    report |= {"rollouts": rollouts, "ideal_rollout_s": round(ideal, 2), "runners": rows, "runs": raw}
    report["load_at_end"] = load()
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["runners"]
    labels = list(rows)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bars = ax.bar(labels, [rows[x]["rollouts_per_s"] for x in labels],
                  color=["tab:gray", "tab:blue", "tab:orange", "tab:green"][: len(labels)])  # fmt: skip
    ax.bar_label(bars, fmt="%.3g")
    ax.axhline(report["rollouts"] / report["ideal_rollout_s"], color="k", linestyle=":", label="no overhead at all")
    load = report["load"]
    ax.set(
        ylabel="rollouts / s (higher is better)",
        title=f"{report['rollouts']} rollouts ({load['groups']} groups x {load['n']}), model {load['model_s']:g} s, "
        f"tool {load['tool_s']:g} s, {load['tool_turns']} tool turns",
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat instead of two")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run(args.quick))
    (OUT / "groups.json").write_text(json.dumps(report, indent=2))
    plot(report, OUT / "groups.png")
    print(json.dumps(report["runners"], indent=2))
    print(f"load average at start {report['load_at_start']}, at end {report['load_at_end']}")
    print(f"wrote {OUT / 'groups.json'} and {OUT / 'groups.png'}")


if __name__ == "__main__":
    main()
