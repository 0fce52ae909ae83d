"""Scenarios (a) to (c): one rollout at a time, saturation, realistic RL load — each side by side.

Every scenario runs its runners (direct, gymflow, bare Temporal, before/after variants) in the
same run against the same server and endpoint, alternating between them so that load from other
processes on the machine falls on all of them alike. A rollout's activity plan is counted as
gymflow's original one, `2 * tool_turns + 4` activities (init, tool_turns + 1 model turns,
tool_turns tool calls, reward, release), for every runner, so "activity-steps per second" is
the same unit of rollout work whatever a runner does inside (gymflow and the bare workflow now
run 2 * tool_turns + 3: reward and release are one activity).

Each gymflow runner has a bare-Temporal runner with the same plan (`ceiling`): `bare` for model
turns and tool calls as regular activities, `bare+local` for model turns as local activities,
`bare+fused` for one activity per turn (gymflow's fused turns, the benchmark env's default).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from bench.bare import BARE_WORKFLOW, BareInput
from bench.direct import DirectRunner
from bench.procs import Procs, measured, profiled
from bench.workload import ENV_NAME, bench_task, endpoint
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput, RolloutLimits
from gymflow.workers.sdk.client import run_rollout

DIRECT = "direct"
BARE = "bare"
BARE_LOCAL = "bare+local"
"""The bare workflow with model turns as local activities: the ceiling for gymflow's local turns."""
BARE_FUSED = "bare+fused"
"""The bare workflow with one activity per turn on the node queue: the ceiling for fused turns."""
BARE_WORK = "bare+fused+work"
"""`BARE_FUSED` whose turns do the rollout's work as the direct loop does (BareInput.model_url):
Temporal with gymflow's fused plan and the same work, nothing else."""
BARE_WORK_RUNNER = "bare+fused+work+runner"
"""`BARE_WORK` in gymflow's workflow runner (gymflow.workers.sandbox_runner) instead of the SDK's stock
sandbox runner: what gymflow's orchestration costs once the runner's own gain is given to bare too."""
SAME_WORK = ((BARE_WORK, ""), (BARE_WORK_RUNNER, "_same_runner"))
"""The ceilings doing gymflow's work, and the suffix of the row fields compared with each."""
LOCAL = "gymflow-local"
"""The gymflow worker, rollouts asking for model turns as local activities."""
CLASSIC = "classic"
LOCAL_PLAN = "local"
FUSED = "fused"
PLANS = (CLASSIC, LOCAL_PLAN, FUSED)
"""Rollout plans: one activity per model turn and tool call, model turns as local activities, or
one activity per turn (gymflow.activities.turn; the benchmark env's default)."""


def ceiling(plan: str) -> str:
    """The bare runner with the same activity plan."""
    return {CLASSIC: BARE, LOCAL_PLAN: BARE_LOCAL, FUSED: BARE_FUSED}[plan]


def add_same_plan_ratio(rows: dict[str, dict[str, Any]], runners: Sequence[Runner], key: str) -> None:
    """Set each row's ``vs_bare_same_plan``: its `key` over that of the bare runner with the same plan;
    and a gymflow fused row's ``vs_bare_same_work``: over `BARE_WORK`'s, and
    ``vs_bare_same_work_same_runner``: over `BARE_WORK_RUNNER`'s (each when it ran)."""
    for runner in runners:
        same = rows.get(ceiling(runner.plan), {}).get(key)
        row = rows[runner.label]
        row["vs_bare_same_plan"] = round(row[key] / same, 3) if same else None
        if runner.kind not in (DIRECT, BARE) and runner.plan == FUSED:
            for label, suffix in SAME_WORK:
                if (work := rows.get(label, {}).get(key)) is not None:
                    row[f"vs_bare_same_work{suffix}"] = round(row[key] / work, 3) if work else None


def add_paired_ratios(rows: dict[str, dict[str, Any]], runners: Sequence[Runner]) -> None:
    """(b): set a gymflow fused row's ``vs_bare_same_work{suffix}_rounds``, its rate over the same-work
    ceiling's in each round (the two ran minutes apart, in the same round), and their median,
    ``vs_bare_same_work{suffix}_paired``.

    On this box a runner's rate moves by up to 50 % between rounds with the box's speed (the endpoint
    spent up to 50 % more CPU on the same requests), and the best round of each runner is the box's
    fastest moment, which lands on one runner or the other: the best-round ratio of unchanged code
    read 0.85-1.08x across runs. Pairing each round with its neighbour and taking the median over
    rounds leaves out most of that drift."""
    for runner in runners:
        row = rows[runner.label]
        if runner.kind in (DIRECT, BARE) or runner.plan != FUSED:
            continue
        for label, suffix in SAME_WORK:
            work = rows.get(label, {}).get("steps_per_s_all")
            if not work:
                continue
            ratios = [round(mine / theirs, 3) for mine, theirs in zip(row["steps_per_s_all"], work, strict=False)]
            row[f"vs_bare_same_work{suffix}_rounds"] = ratios
            row[f"vs_bare_same_work{suffix}_paired"] = round(statistics.median(ratios), 3)


def activities(tool_turns: int) -> int:
    """Activities of gymflow's original rollout plan with `tool_turns` tool turns."""
    return 2 * tool_turns + 4


def plan_activities(plan: str, tool_turns: int) -> int:
    """Activities (local ones included) a rollout of `plan` runs today: init, then per plan the
    model turns and tool calls (classic, local) or the turns (fused, the last one with the reward),
    then the reward (classic, local)."""
    if plan == FUSED:
        return 1 + tool_turns + 1
    return 1 + (tool_turns + 1) + tool_turns + 1


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Runner:
    """One way of running the benchmark rollout: direct, bare Temporal, or a gymflow worker's queue."""

    label: str
    kind: str
    """``direct``, ``bare`` or ``gymflow``."""
    task_queue: str | None = None
    plan: str = CLASSIC
    """`CLASSIC`, `LOCAL_PLAN` (gymflow: `ModelConfig.local_activity`; bare: `BareInput.local_model`)
    or `FUSED` (gymflow: the env's fused turns; bare: `BareInput.fused`); direct ignores it."""

    work: bool = False
    """A bare fused runner whose turns do the work (`BARE_WORK`)."""

    @property
    def local_turns(self) -> bool:
        return self.plan == LOCAL_PLAN


@dataclass
class Bench:
    client: Client
    procs: Procs
    policy_base: str
    direct: DirectRunner
    profile: dict[str, Path] = field(default_factory=dict)
    fresh_server: Callable[[], Awaitable[None]] | None = None
    """Replace the dev server by one with an empty database (same address; the workers reconnect).
    Set, (b) and (c) measure every run of a Temporal runner on its own fresh server: the server's
    SQLite database grows with every run, and later runs of one server were up to 2x slower."""
    """Runner label -> where to write a py-spy profile of its worker during saturation."""

    async def rollout(self, runner: Runner, index: int, *, tool_turns: int, model_s: float, tool_s: float) -> float:
        """Run one rollout; returns its wall seconds. Raises if the rollout did not finish correctly."""
        task = bench_task(index, tool_turns=tool_turns, tool_delay_s=tool_s)
        model = ModelConfig(base_url=endpoint(self.policy_base, model_s), local_activity=runner.local_turns)
        started = time.perf_counter()
        if runner.kind == DIRECT:
            messages = await self.direct.rollout(task, model)
            ok = messages[-1].content == f"<answer>{tool_turns}</answer>"
        elif runner.kind == BARE:
            plan = BareInput(
                tool_turns,
                local_model=runner.local_turns,
                fused=runner.plan == FUSED,
                model_delay_s=model_s,
                tool_delay_s=tool_s,
                model_url=model.base_url if runner.work else None,
            )
            await self.client.execute_workflow(
                BARE_WORKFLOW,
                plan,
                id=f"bare-{uuid.uuid4().hex}",
                task_queue=runner.task_queue or "",
            )
            ok = True
        else:
            result = await run_rollout(
                self.client,
                RolloutInput(
                    env=ENV_NAME,
                    task=task,
                    model=model,
                    limits=RolloutLimits(max_turns=tool_turns + 1),
                    fuse_turns=None if runner.plan == FUSED else False,
                ),
                task_queue=runner.task_queue or "",
            )
            ok = result.reward is not None and result.reward.total == 1.0 and result.tool_calls == tool_turns
        if not ok:
            raise RuntimeError(f"{runner.label}: rollout {index} did not finish as expected")
        return time.perf_counter() - started

    async def endpoint_stats(self, reset: bool = True) -> dict[str, int]:
        async with httpx.AsyncClient() as http:
            response = await (http.post if reset else http.get)(self.policy_base + "/bench/stats")
            return dict(response.json())


async def light(bench: Bench, runners: Sequence[Runner], *, tool_turns: int, rollouts: int) -> dict[str, Any]:
    """(a) One rollout at a time, zero-latency model and tool: what each activity adds."""
    walls: dict[str, list[float]] = {r.label: [] for r in runners}
    for runner in runners:  # warm-up: connections, caches, imports
        for i in range(2):
            await bench.rollout(runner, i, tool_turns=tool_turns, model_s=0, tool_s=0)
    record: dict[str, Any]
    with measured(bench.procs) as record:
        for i in range(rollouts):
            for runner in runners:  # interleaved, so load changes fall on every runner alike
                walls[runner.label].append(await bench.rollout(runner, i, tool_turns=tool_turns, model_s=0, tool_s=0))
    n = activities(tool_turns)
    direct_p50 = statistics.median(walls[DIRECT])
    rows: dict[str, dict[str, float | None]] = {}
    for runner in runners:
        values = walls[runner.label]
        p50 = statistics.median(values)
        actual = plan_activities(runner.plan, tool_turns)
        rows[runner.label] = {
            "rollout_p50_ms": round(p50 * 1000, 1),
            "rollout_p95_ms": round(pct(values, 0.95) * 1000, 1),
            "activities": actual,
            "per_activity_p50_ms": round(p50 * 1000 / actual, 2),
            "added_per_activity_p50_ms": round((p50 - direct_p50) * 1000 / n, 2),
        }
    for runner in runners:  # what gymflow adds per activity over bare Temporal running the same plan
        same = rows.get(ceiling(runner.plan)) if runner.kind != DIRECT else None
        row = rows[runner.label]
        gap = (row["rollout_p50_ms"] or 0) - (same["rollout_p50_ms"] or 0) if same else None
        per = row["activities"] or 1
        row["gap_vs_bare_same_plan_ms"] = round(gap / per, 2) if gap is not None else None
        # The bare activities do none of the rollout's work (model call, tool call, reward), so all
        # of bare's time is orchestration; gymflow's is orchestration plus that work, which the
        # direct loop measures on its own (same endpoint, env and HTTP client, same run).
        if gap is not None and (runner.kind != BARE or runner.work):
            gap -= direct_p50 * 1000
        row["added_vs_bare_same_plan_ms"] = round(gap / per, 2) if gap is not None else None
        for label, suffix in SAME_WORK:
            work = rows.get(label)
            if work is not None and runner.kind != BARE and runner.plan == FUSED:  # the work done by both
                gap_ms = (row["rollout_p50_ms"] or 0) - (work["rollout_p50_ms"] or 0)
                row[f"added_vs_bare_same_work{suffix}_ms"] = round(gap_ms / per, 2)
    return {
        "tool_turns": tool_turns,
        "activities_per_rollout": n,
        "rollouts_per_runner": rollouts,
        "runners": rows,
        "raw_s": walls,
        **record,
    }


async def batch(
    bench: Bench, runner: Runner, *, rollouts: int, concurrency: int, tool_turns: int, model_s: float, tool_s: float
) -> float:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> float:
        async with semaphore:
            return await bench.rollout(runner, i, tool_turns=tool_turns, model_s=model_s, tool_s=tool_s)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(rollouts)))
    return time.perf_counter() - started


async def side_by_side(
    bench: Bench,
    runners: Sequence[Runner],
    *,
    repeats: int,
    run: Callable[[Runner], Awaitable[float]],
    warm_up: Callable[[Runner], Awaitable[object]],
) -> dict[str, list[dict[str, Any]]]:
    """`run` each runner `repeats` times, alternating; wall, CPU, load and endpoint connections of each.

    With `Bench.fresh_server`, each run of a Temporal runner gets a new, empty server first, then
    `warm_up` (unmeasured: the workers reconnect); without, every runner is warmed up once.
    """
    results: dict[str, list[dict[str, Any]]] = {r.label: [] for r in runners}
    if bench.fresh_server is None:
        for runner in runners:
            await warm_up(runner)
    for repeat in range(repeats):
        # Each repeat starts one runner later, so no runner is always the first after a warm-up.
        shift = repeat % len(runners)
        for runner in [*runners[shift:], *runners[:shift]]:
            if bench.fresh_server is not None:
                if runner.kind != DIRECT:
                    await bench.fresh_server()
                await warm_up(runner)
            await bench.endpoint_stats(reset=True)
            spy = bench.profile.pop(runner.label, None)  # the first run of a runner only
            with profiled(bench.procs.pids.get(runner.label), spy), measured(bench.procs) as record:
                record["batch_wall_s"] = await run(runner)
            record["endpoint"] = await bench.endpoint_stats(reset=True)
            results[runner.label].append(record)
    return results


async def saturation(
    bench: Bench, runners: Sequence[Runner], *, tool_turns: int, concurrency: int, rollouts: int, repeats: int
) -> dict[str, Any]:
    """(b) Many concurrent zero-latency rollouts: activity-steps per second, vs the bare ceiling."""

    async def warm_up(runner: Runner) -> float:
        return await batch(
            bench, runner, rollouts=concurrency, concurrency=concurrency, tool_turns=2, model_s=0, tool_s=0
        )

    async def run(runner: Runner) -> float:
        return await batch(
            bench, runner, rollouts=rollouts, concurrency=concurrency, tool_turns=tool_turns, model_s=0, tool_s=0
        )

    raw = await side_by_side(bench, runners, repeats=repeats, run=run, warm_up=warm_up)
    steps = rollouts * activities(tool_turns)
    rows = {}
    for label, records in raw.items():
        rates = [steps / r["batch_wall_s"] for r in records]
        rows[label] = {
            "steps_per_s": round(max(rates), 1),
            "steps_per_s_median": round(statistics.median(rates), 1),
            "steps_per_s_all": [round(x, 1) for x in rates],
            "calibration_ms_all": [r.get("calibration_ms_before") for r in records],
        }
    bare = rows.get(BARE, {}).get("steps_per_s")
    for row in rows.values():
        row["vs_bare"] = round(row["steps_per_s"] / bare, 3) if bare else None
    add_same_plan_ratio(rows, runners, "steps_per_s")
    add_paired_ratios(rows, runners)
    return {
        "tool_turns": tool_turns,
        "concurrency": concurrency,
        "rollouts": rollouts,
        "activity_steps_per_run": steps,
        "runners": rows,
        "runs": raw,
    }


async def realistic(
    bench: Bench,
    runners: Sequence[Runner],
    *,
    tool_turns: int,
    concurrency: int,
    model_s: float,
    tool_s: float,
    repeats: int,
) -> dict[str, Any]:
    """(c) RL load: slow model, slower tools, many rollouts at once: wall time vs direct."""

    async def run(runner: Runner) -> float:
        return await batch(
            bench,
            runner,
            rollouts=concurrency,
            concurrency=concurrency,
            tool_turns=tool_turns,
            model_s=model_s,
            tool_s=tool_s,
        )

    async def warm_up(runner: Runner) -> float:
        return await batch(bench, runner, rollouts=8, concurrency=8, tool_turns=1, model_s=0, tool_s=0)

    raw = await side_by_side(bench, runners, repeats=repeats, run=run, warm_up=warm_up)
    rows = {label: {"wall_s": round(min(r["batch_wall_s"] for r in records), 2)} for label, records in raw.items()}
    direct = rows[DIRECT]["wall_s"]
    for row in rows.values():
        row["vs_direct"] = round(row["wall_s"] / direct, 3)
    add_same_plan_ratio(rows, runners, "wall_s")
    return {
        "tool_turns": tool_turns,
        "model_calls_per_rollout": tool_turns + 1,
        "concurrency": concurrency,
        "model_delay_s": model_s,
        "tool_delay_s": tool_s,
        "ideal_rollout_s": round((tool_turns + 1) * model_s + tool_turns * tool_s, 2),
        "runners": rows,
        "runs": raw,
    }
