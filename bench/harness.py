"""Benchmark: a harness rollout's overhead per model call over the same program calling the model directly.

    python -m bench.harness [--calls 50] [--repeats 3]

Writes bench/out/harness.{json,png}. One run starts a dev server (tuned as `gymflow server` runs
it), the scripted policy endpoint (every answer "I don't know.": the model costs ~nothing) and a
worker with its gateway, all in this process. The program (bench/agents/calls.py, the official
openai client in its own venv, `python3 tests/third_party_agents.py clients`) makes `--calls` chat
calls of a growing conversation and times each one itself. Variants, alternated `--repeats` times:

* ``direct``: the program's OPENAI_BASE_URL is the policy endpoint;
* ``harness``: the program is a harness rollout's (gymflow.envs.harness); each call goes gateway ->
  `model_call` Update -> `model_call` activity -> the endpoint, and back;
* ``harness-local``: the same with `ModelConfig.local_activity` (the turn runs as a local activity
  of the update's workflow task: one server round trip fewer);
* ``update-only``: the floor of the mechanism: this process sends a bare workflow the same requests
  as Updates (no gateway, no activity, no model), one at a time; its latency is what any
  Update-based design pays per call on this box.

The figures per variant: the median and p90 of the per-call latency the program measured (the
overhead is a harness variant's median minus direct's), and the CPU time per call of everything
involved — this process (worker, gateway, policy endpoint), the Temporal dev server and the program —
whose difference to direct's is the work the harness adds to each call. On a box whose cores are
busy with other work, wall times stretch by the load while CPU per call barely moves, so both are
given with the load average around the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from temporalio import workflow
from temporalio.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gymflow.activities.model import ModelConfig  # noqa: E402
from gymflow.activities.names import SEARCH_ATTRIBUTES  # noqa: E402
from gymflow.activities.schema import RolloutInput, RolloutLimits  # noqa: E402
from gymflow.envs.contract import Task  # noqa: E402
from gymflow.envs.policy import NullPolicy  # noqa: E402
from gymflow.workers.client import DATA_CONVERTER  # noqa: E402
from gymflow.workers.config import Settings  # noqa: E402
from gymflow.workers.sdk.client import run_rollout  # noqa: E402
from gymflow.workers.servers.policy import PolicyServer  # noqa: E402
from gymflow.workers.servers.temporal import QUEUE_TUNING, temporal_binary  # noqa: E402
from gymflow.workers.worker import running_worker  # noqa: E402

OUT = ROOT / "bench" / "out"
PROGRAM = ROOT / "bench" / "agents" / "calls.py"
PYTHON = ROOT / ".agents" / "clients" / "bin" / "python"
VARIANTS = ("direct", "harness", "harness-local", "update-only")
FLOOR_QUEUE = "bench-update-floor"


@workflow.defn(name="BenchUpdateFloor", sandboxed=False)
class UpdateFloor:
    """A workflow that answers Updates at once (the update-only variant)."""

    def __init__(self) -> None:
        self.done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.done)

    @workflow.update
    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.done = bool(request.get("stop"))
        return {"choices": [{"message": {"role": "assistant", "content": "ok"}}], "turn": len(request)}


async def update_only(client: Any, calls: int) -> list[float]:
    handle = await client.start_workflow(UpdateFloor.run, id=f"floor-{uuid.uuid4().hex[:8]}", task_queue=FLOOR_QUEUE)
    messages: list[dict[str, str]] = [{"role": "system", "content": "Answer briefly."}]
    latencies = []
    for index in range(calls):
        messages.append({"role": "user", "content": f"call {index}: say ok"})
        started = time.perf_counter()
        await handle.execute_update(UpdateFloor.call, {"model": "any", "messages": messages})
        latencies.append((time.perf_counter() - started) * 1000)
        messages.append({"role": "assistant", "content": "ok"})
    await handle.execute_update(UpdateFloor.call, {"stop": True})
    return latencies


def cpu_seconds() -> dict[str, float]:
    """CPU time of this process (worker, gateway, policy endpoint), of the programs (reaped children and
    live ones) and of the dev server (a live descendant)."""
    tick = os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = {"process": own.ru_utime + own.ru_stime, "programs": reaped.ru_utime + reaped.ru_stime, "server": 0.0}
    pending, seen = [os.getpid()], set()
    while pending:
        pid = pending.pop()
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            for child in task.read_text().split():
                if int(child) not in seen:
                    seen.add(int(child))
                    pending.append(int(child))
    for pid in seen:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        total["server" if name.startswith("temporal") else "programs"] += (int(fields[11]) + int(fields[12])) / tick
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


async def direct(url: str, calls: int) -> list[float]:
    env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "direct"}
    process = await asyncio.create_subprocess_exec(
        str(PYTHON), str(PROGRAM), str(calls), env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    return list(json.loads(out.decode().strip().splitlines()[-1])["latencies_ms"])


async def harness(client: Any, queue: str, env_file: Path, url: str, calls: int, *, local: bool) -> list[float]:
    result = await run_rollout(
        client,
        RolloutInput(
            env=str(env_file),
            task=Task(id=f"bench-{uuid.uuid4().hex[:6]}", prompt=str(calls)),  # the program's {prompt}: its calls
            model=ModelConfig(base_url=url, local_activity=local),
            limits=RolloutLimits(max_turns=calls + 1),
        ),
        task_queue=queue,
    )
    assert result.program is not None and result.program.exit_code == 0, result.program
    assert result.turns == calls, result.turns
    return list(json.loads(result.program.output.strip().splitlines()[-1])["latencies_ms"])


async def measure(calls: int, repeats: int, work: Path) -> dict[str, Any]:
    from temporalio.testing import WorkflowEnvironment

    env_file = work / "calls.yaml"
    env_file.write_text(yaml.safe_dump({"harness": {"command": [str(PYTHON), str(PROGRAM), "{prompt}"]}}))
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, dict[str, float]] = {v: {"process": 0.0, "programs": 0.0, "server": 0.0} for v in VARIANTS}
    loads = [os.getloadavg()[0]]
    server = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=DATA_CONVERTER,
        dev_server_log_level="error",
        dev_server_extra_args=list(QUEUE_TUNING),  # as `gymflow server` runs it
    )
    try:
        queue = f"bench-harness-{uuid.uuid4().hex[:6]}"
        settings = Settings(task_queue=queue, workspace_root=work / "ws", data_dir=work / "data", mcp_pool_size=0)
        floor = Worker(server.client, task_queue=FLOOR_QUEUE, workflows=[UpdateFloor])
        async with PolicyServer(NullPolicy()) as policy, running_worker(server.client, settings), floor:
            await harness(server.client, queue, env_file, policy.url, 3, local=False)  # warm the worker up
            runs = {
                "direct": lambda: direct(policy.url, calls),
                "harness": lambda: harness(server.client, queue, env_file, policy.url, calls, local=False),
                "harness-local": lambda: harness(server.client, queue, env_file, policy.url, calls, local=True),
                "update-only": lambda: update_only(server.client, calls),
            }
            for _ in range(repeats):
                for variant, run in runs.items():
                    before = cpu_seconds()
                    samples[variant] += await run()
                    for part, seconds in cpu_seconds().items():
                        cpu[variant][part] += seconds - before[part]
                loads.append(os.getloadavg()[0])
    finally:
        await server.shutdown()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "calls_per_run": calls,
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "load_average": {"min": min(loads), "max": max(loads)},
        "variants": {},
    }
    base = statistics.median(samples["direct"])
    base_cpu = sum(cpu["direct"].values()) / len(samples["direct"])
    for variant, values in samples.items():
        per_call_cpu = sum(cpu[variant].values()) / len(values)
        report["variants"][variant] = {
            "calls": len(values),
            "median_ms": round(statistics.median(values), 3),
            "p90_ms": pct(values, 0.9),
            "overhead_median_ms": round(statistics.median(values) - base, 3),
            "cpu_ms_per_call": round(per_call_cpu * 1000, 3),
            "overhead_cpu_ms_per_call": round((per_call_cpu - base_cpu) * 1000, 3),
            "cpu_ms_per_call_by_part": {k: round(v / len(values) * 1000, 3) for k, v in cpu[variant].items()},
        }
    report["samples_ms"] = samples
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    data = [report["samples_ms"][v] for v in VARIANTS]
    ax.boxplot(data, tick_labels=list(VARIANTS), showfliers=False)
    for index, variant in enumerate(VARIANTS, start=1):
        stats = report["variants"][variant]
        label = f"{stats['median_ms']:.1f} ms" + (
            f"\n+{stats['overhead_median_ms']:.1f} ms wall\n+{stats['overhead_cpu_ms_per_call']:.1f} ms CPU"
            if variant.startswith("harness")
            else ""
        )
        ax.annotate(label, (index, stats["median_ms"]), textcoords="offset points", xytext=(22, 0), fontsize=8)
    ax.set_ylabel("latency per model call (ms)")
    load = report["load_average"]
    ax.set_title(
        f"harness overhead per model call ({report['calls_per_run']} calls x {report['repeats']}, "
        f"load {load['min']:.1f}-{load['max']:.1f} on {report['cpus']} cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not PYTHON.exists():
        raise SystemExit("the openai client's venv is missing: python3 tests/third_party_agents.py clients")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        report = asyncio.run(measure(args.calls, args.repeats, Path(work)))
    (OUT / "harness.json").write_text(json.dumps(report, indent=1))
    plot(report, OUT / "harness.png")
    print(json.dumps({k: v for k, v in report.items() if k != "samples_ms"}, indent=1))


if __name__ == "__main__":
    main()
