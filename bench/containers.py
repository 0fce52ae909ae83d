"""Benchmark: rollout containers on this node, per engine — start latency cold and from the warm pool,
the overhead of a terminal tool call over a plain `exec`, how many task containers the box holds at
once, each running a command, and (with `--services`) the start of a rollout with a compose service.

    python bench/containers.py [--engines podman,docker] [--samples 20] [--containers 64] [--pool 4]

Every engine named (default: podman and docker, those that answer) is measured in the same run, one
after the other. Prints JSON and writes bench/out/containers.json and containers.png. Needs a rootful
engine and the base image (made from Debian's packages on first use, or moved from the other engine).
Every container it starts is removed before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gymflow.envs.errors import EngineUnavailable
from gymflow.envs.runtime import compose
from gymflow.envs.runtime.base import Limits, RolloutSpec
from gymflow.envs.runtime.container import ContainerRuntime, ContainerSandbox
from gymflow.envs.runtime.engine import Engine
from gymflow.envs.runtime.images import ensure_base
from gymflow.envs.runtime.reaper import reap
from gymflow.envs.runtime.terminal import build_server

IMAGE = "debian:bookworm-slim"
STATE_ROOT = Path("/var/tmp/gymflow-bench-runtime")
MEMINFO = Path("/proc/meminfo")
LIMITS = Limits(cpus=1, memory_mb=256, storage_mb=1024, pids=256)
SERVICES = """
services:
  main: {image: debian:bookworm-slim}
  db:
    image: debian:bookworm-slim
    command:
      - perl
      - -MIO::Socket::INET
      - -e
      - my $$s = IO::Socket::INET->new(LocalPort => 7000, Listen => 4) or die; 1 while $$s->accept
    healthcheck: {test: [CMD, bash, -c, exec 3<>/dev/tcp/127.0.0.1/7000], interval: 100ms, retries: 100}
"""
"""One service beside the main container, healthy once it listens (as the tests' service-token task)."""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def spec(runtime: ContainerRuntime, root: Path) -> RolloutSpec:
    rollout = uuid.uuid4().hex[:8]
    return RolloutSpec(
        rollout_id=rollout, node_id=runtime.node_id, workspace=str(root / rollout), limits=LIMITS, image=IMAGE,
        workdir="/app", workspace_mount="/logs",
    )  # fmt: skip


async def starts(runtime: ContainerRuntime, root: Path, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        if runtime.pool_size:
            await runtime.warm(spec(runtime, root))
        started = time.monotonic()
        sandbox = await runtime.start(spec(runtime, root))
        times.append(time.monotonic() - started)
        await sandbox.release()
    return times


async def exec_overhead(runtime: ContainerRuntime, root: Path, samples: int) -> dict[str, float]:
    from mcp import Client

    sandbox = await runtime.start(spec(runtime, root))
    try:
        plain, tool = [], []
        for _ in range(samples):
            started = time.monotonic()
            process = await asyncio.create_subprocess_exec(runtime.engine.binary, "exec", sandbox.name, "true")
            await process.wait()
            plain.append(time.monotonic() - started)
        async with Client(build_server(sandbox)) as client:
            for _ in range(samples):
                started = time.monotonic()
                await client.call_tool("bash", {"command": "true"})
                tool.append(time.monotonic() - started)
        return {
            "engine_exec_p50_s": pct(plain, 0.5),
            "terminal_bash_p50_s": pct(tool, 0.5),
            "overhead_p50_s": round(pct(tool, 0.5) - pct(plain, 0.5), 4),
        }
    finally:
        await sandbox.release()


async def capacity(runtime: ContainerRuntime, root: Path, count: int) -> dict[str, object]:
    held: list[ContainerSandbox] = []
    started = time.monotonic()
    try:
        for batch in range(0, count, 8):
            held += await asyncio.gather(*(runtime.start(spec(runtime, root)) for _ in range(min(8, count - batch))))
        up_s = time.monotonic() - started
        # Every container runs a command at once: a short CPU burn plus a file write.
        cmd = ["sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo ok > /app/done; cat /app/done"]
        started = time.monotonic()
        results = await asyncio.gather(*(s.exec(cmd, timeout_s=600) for s in held))
        ok = sum(r.stdout.strip() == "ok" for r in results)
        meminfo = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines())  # noqa: ASYNC240 - procfs
        return {
            "containers": len(held),
            "all_answered": ok == len(held),
            "answered": ok,
            "start_all_s": round(up_s, 2),
            "concurrent_command_s": round(time.monotonic() - started, 2),
            "mem_available_gib_while_held": round(int(meminfo["MemAvailable"].split()[0]) / 2**20, 2),
        }
    finally:
        await asyncio.gather(*(s.release() for s in held), return_exceptions=True)


async def services_start(runtime: ContainerRuntime, root: Path, samples: int) -> dict[str, float]:
    """A rollout with one compose service (a TCP listener that must be healthy first): network, service, main."""
    project = compose.parse(SERVICES, base_dir=root, variables={})
    times = []
    for _ in range(samples):
        started = time.monotonic()
        sandbox = await runtime.start(spec(runtime, root).model_copy(update={"services": project}))
        times.append(time.monotonic() - started)
        await sandbox.release()
    return {"start_p50_s": pct(times, 0.5), "start_p95_s": pct(times, 0.95)}


async def measure(engine: Engine, args: argparse.Namespace) -> dict[str, object]:
    node = f"bench-{uuid.uuid4().hex[:6]}"
    cold = ContainerRuntime(node_id=node, state_root=STATE_ROOT, engine=engine)
    warm = ContainerRuntime(node_id=node, state_root=STATE_ROOT, pool_size=args.pool, engine=engine)
    await ensure_base(cold.engine, IMAGE, state_dir=STATE_ROOT)
    root = Path(tempfile.mkdtemp(prefix="gymflow-bench-"))
    try:
        cold_times = await starts(cold, root, args.samples)
        warm_times = await starts(warm, root, args.samples)
        return {
            "binary": engine.binary,
            "disk_cap": (await cold.disk_guarantee(IMAGE)).value,
            "start_cold_p50_s": pct(cold_times, 0.5),
            "start_cold_p95_s": pct(cold_times, 0.95),
            "start_warm_p50_s": pct(warm_times, 0.5),
            "start_warm_p95_s": pct(warm_times, 0.95),
            "exec": await exec_overhead(cold, root, args.samples),
            "capacity": await capacity(cold, root, args.containers),
            "with_a_service": await services_start(cold, root, max(3, args.samples // 4)),
        }
    finally:
        await warm.close()
        await cold.close()
        await reap(cold.engine, node_id=node, state_root=STATE_ROOT, live_rollouts=(), owner=None)


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(report["engines"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = ["cold p50", "cold p95", "with a service p50"]
    for i, name in enumerate(engines):
        row = report["engines"][name]
        values = [row["start_cold_p50_s"], row["start_cold_p95_s"], row["with_a_service"]["start_p50_s"]]
        left.bar([x + 0.4 * i for x in range(len(labels))], values, width=0.4, label=name)
        cap = row["capacity"]
        right.bar([0.4 * i, 1 + 0.4 * i], [cap["start_all_s"], cap["concurrent_command_s"]], width=0.4, label=name)
    left.set_xticks([x + 0.2 for x in range(len(labels))], labels)
    left.set_ylabel("seconds")
    left.set_title("one rollout container: start")
    right.set_xticks([0.2, 1.2], ["start all", "one command in each"])
    right.set_title(f"{report['containers']} containers at once")
    for ax in (left, right):
        ax.legend()
    fig.tight_layout()
    fig.savefig(out)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engines", default="podman,docker", help="comma-separated; those that do not answer are skipped"
    )
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--containers", type=int, default=64)
    parser.add_argument("--pool", type=int, default=4)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "limits": LIMITS.model_dump(), "containers": args.containers,
        "engines": {}, "skipped": {},
    }  # fmt: skip
    for name in args.engines.split(","):
        try:
            engine = Engine.detect(name)
        except EngineUnavailable as exc:
            report["skipped"][name] = str(exc)
            continue
        report["engines"][engine.kind] = await measure(engine, args)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "containers.json").write_text(json.dumps(report, indent=2))
    if report["engines"]:
        plot(report, out / "containers.png")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
