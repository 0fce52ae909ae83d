"""Benchmark: rollout containers on this node — start latency cold and from the warm pool, the
overhead of a terminal tool call over a plain `podman exec`, and how many task containers the box
holds at once, each running a command.

    python bench/containers.py [--samples 20] [--containers 64] [--pool 4]

Prints JSON (and writes bench/out/containers.json). Needs rootful podman and the base image (made
from Debian's packages on first use). Every container it starts is removed before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path

from gymflow.envs.runtime.base import Limits, RolloutSpec
from gymflow.envs.runtime.container import ContainerRuntime, ContainerSandbox
from gymflow.envs.runtime.images import ensure_base
from gymflow.envs.runtime.reaper import reap
from gymflow.envs.runtime.terminal import build_server

IMAGE = "debian:bookworm-slim"
STATE_ROOT = Path("/var/tmp/gymflow-bench-runtime")
MEMINFO = Path("/proc/meminfo")
LIMITS = Limits(cpus=1, memory_mb=256, storage_mb=1024, pids=256)


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
            "podman_exec_p50_s": pct(plain, 0.5),
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--containers", type=int, default=64)
    parser.add_argument("--pool", type=int, default=4)
    args = parser.parse_args()
    node = f"bench-{uuid.uuid4().hex[:6]}"
    cold = ContainerRuntime(node_id=node, state_root=STATE_ROOT)
    warm = ContainerRuntime(node_id=node, state_root=STATE_ROOT, pool_size=args.pool)
    await ensure_base(cold.engine, IMAGE, state_dir=STATE_ROOT)
    root = Path(tempfile.mkdtemp(prefix="gymflow-bench-"))
    try:
        cold_times = await starts(cold, root, args.samples)
        warm_times = await starts(warm, root, args.samples)
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "start_cold_p50_s": pct(cold_times, 0.5),
            "start_cold_p95_s": pct(cold_times, 0.95),
            "start_warm_p50_s": pct(warm_times, 0.5),
            "start_warm_p95_s": pct(warm_times, 0.95),
            "exec": await exec_overhead(cold, root, args.samples),
            "capacity": await capacity(cold, root, args.containers),
            "limits": LIMITS.model_dump(),
        }
    finally:
        await warm.close()
        await cold.close()
        await reap(cold.engine, node_id=node, state_root=STATE_ROOT, live_rollouts=(), owner=None)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "containers.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
