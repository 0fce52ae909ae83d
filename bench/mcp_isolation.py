"""Benchmark: per-rollout MCP isolation — warm-pool vs cold init latency, and how many isolated
calculator servers one machine holds, with the memory each costs.

    python bench/mcp_isolation.py [--servers 1000] [--plain-servers 200] [--samples 30]

Writes bench/out/mcp_isolation.json and bench/out/mcp_isolation.png. Each measurement is made for
both ways a server starts (gymflow.envs.runtime.forkserver): `plain` (a new interpreter that imports
`mcp` itself) and `fork` (forked from the node's fork server, which imported it once):

1. init latency: `McpEnv.init_rollout` with the pool off (a cold start: process + handshake) and
   with a warm pool (a ready set handed out), p50/p95 over `--samples` inits;
2. capacity: `--servers` rollouts held at once (`--plain-servers` plainly started), each with its
   own calculator process and workspace, started 8 at a time; every one must answer a tool call
   while all are up; memory per server is PSS/RSS from /proc/PID/smaps_rollup, and the run stops
   early if MemAvailable falls under 2 GiB;
3. what a server's memory and start time go to: PSS of a bare interpreter and of each import
   layer of the server, and the slowest imports (`python -X importtime`); the same for the
   third-party mcp 1.x calculator when .venv-mcp-servers is installed, for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gymflow.envs.mcp.env import McpEnv  # noqa: E402
from gymflow.envs.runtime.forkserver import node_fork_servers  # noqa: E402

OUT = ROOT / "bench" / "out"
CALCULATOR = {
    "calculator": {
        "command": "python",
        "args": ["-m", "gymflow.envs.builtin.math.servers.calculator"],
        "cwd": str(ROOT),
    }
}
THIRD_PARTY = ROOT / ".mcp-servers" / "calculator" / "bin" / "mcp-server-calculator"
MIN_AVAILABLE_KB = 2 * 1024 * 1024
START_BATCH = 8
LAYERS = [
    ("python", "pass"),
    ("pydantic", "import pydantic"),
    ("mcp_types", "import mcp_types"),
    ("mcp (package __init__)", "import mcp"),
    ("mcp.server.mcpserver", "import mcp.server.mcpserver"),
    ("calculator server module", "import gymflow.envs.builtin.math.servers.calculator"),
]


def smaps(pid: int) -> dict[str, int]:
    """Rss/Pss/Private_Dirty of a process in kB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        fields[key.strip()] = int(value.split()[0])
    return {"rss_kb": fields["Rss"], "pss_kb": fields["Pss"], "private_dirty_kb": fields["Private_Dirty"]}


def mem_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
        "n": len(ordered),
    }


async def init_latency(root: Path, samples: int) -> dict[str, Any]:
    cold_env = McpEnv(servers=CALCULATOR, workspace_root=root / "cold", pool_size=0)
    await cold_env.init_rollout("first")  # a fork server starts once per node, not per rollout
    await cold_env.release_rollout("first")
    cold = []
    for i in range(samples):
        started = time.perf_counter()
        await cold_env.init_rollout(f"c{i}")
        cold.append(time.perf_counter() - started)
        await cold_env.release_rollout(f"c{i}")
    await cold_env.shutdown()
    warm_env = McpEnv(servers=CALCULATOR, workspace_root=root / "warm", pool_size=4)
    warm = []
    for i in range(samples):
        await warm_env.warm()  # steady state between rollouts: the pool has refilled
        started = time.perf_counter()
        await warm_env.init_rollout(f"w{i}")
        warm.append(time.perf_counter() - started)
        assert (await warm_env.run_tool(f"w{i}", "add", a=i, b=1)).text == str(i + 1)
        await warm_env.release_rollout(f"w{i}")
    await warm_env.shutdown()
    return {"cold": percentiles(cold), "warm_pool": percentiles(warm), "raw_s": {"cold": cold, "warm_pool": warm}}


async def capacity(root: Path, target: int) -> dict[str, Any]:
    env = McpEnv(servers=CALCULATOR, workspace_root=root / "capacity", pool_size=0)
    available_before = mem_available_kb()
    worker_before = smaps(os.getpid())
    held: list[str] = []
    curve = []
    stopped_by = "target reached"
    started = time.perf_counter()
    try:
        while len(held) < target:
            if mem_available_kb() < MIN_AVAILABLE_KB:
                stopped_by = "MemAvailable under 2 GiB"
                break
            batch = [f"r{len(held) + i}" for i in range(min(START_BATCH, target - len(held)))]
            await asyncio.gather(*(env.init_rollout(r) for r in batch))
            held += batch
            curve.append(
                {"servers": len(held), "mem_available_kb": mem_available_kb(), "t_s": time.perf_counter() - started}
            )
        start_s = time.perf_counter() - started
        zygotes = [s.process.pid for s in node_fork_servers().servers.values() if s.process is not None]
        answers = await asyncio.gather(*(env.run_tool(r, "multiply", a=i, b=2) for i, r in enumerate(held)))
        all_answered = all(a.text == str(2 * i) for i, a in enumerate(answers))
        workspaces = {env.workspace(r) for r in held}
        pids = [pid for r in held for pid in env.server_pids(r).values() if pid is not None]
        per_server = [smaps(pid) for pid in pids]
        fork_servers = [smaps(pid) for pid in zygotes]
        worker_after = smaps(os.getpid())
        available_after = mem_available_kb()
    finally:
        await env.shutdown()
    pss = [s["pss_kb"] for s in per_server]
    rss = [s["rss_kb"] for s in per_server]
    return {
        "target": target,
        "held_concurrently": len(held),
        "stopped_by": stopped_by,
        "all_answered_while_all_up": all_answered,
        "distinct_workspaces": len(workspaces),
        "start_all_s": round(start_s, 1),
        "server_pss_mb": {"median": round(statistics.median(pss) / 1024, 1), "max": round(max(pss) / 1024, 1)},
        "server_rss_mb": {"median": round(statistics.median(rss) / 1024, 1), "max": round(max(rss) / 1024, 1)},
        "server_private_dirty_mb_median": round(statistics.median(s["private_dirty_kb"] for s in per_server) / 1024, 1),
        "servers_total_pss_gb": round(sum(pss) / 1024 / 1024, 2),
        "fork_servers_pss_mb": [round(z["pss_kb"] / 1024, 1) for z in fork_servers],
        "worker_rss_growth_mb": round((worker_after["rss_kb"] - worker_before["rss_kb"]) / 1024, 1),
        "worker_rss_growth_per_server_kb": round(
            (worker_after["rss_kb"] - worker_before["rss_kb"]) / max(1, len(held))
        ),
        "mem_available_drop_gb": round((available_before - available_after) / 1024 / 1024, 2),
        "mem_available_after_gb": round(available_after / 1024 / 1024, 2),
        "curve": curve,
        "per_server_pss_kb": pss,
    }


def layer_profile() -> list[dict[str, Any]]:
    """PSS of an interpreter after each import layer of the calculator server."""
    rows = []
    for name, code in LAYERS:
        probe = f"{code}\nprint(open('/proc/self/smaps_rollup').read())"
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        fields = {ln.split(":")[0]: int(ln.split()[1]) for ln in out.splitlines()[1:] if ":" in ln}
        rows.append({"layer": name, "pss_mb": round(fields["Pss"] / 1024, 1), "rss_mb": round(fields["Rss"] / 1024, 1)})
    return rows


def import_profile(python: str, module: str, top: int = 8) -> dict[str, Any]:
    """Total import time of `module` and its slowest self-time imports (`-X importtime`)."""
    started = time.perf_counter()
    err = subprocess.run([python, "-X", "importtime", "-c", f"import {module}"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stderr  # fmt: skip
    wall = time.perf_counter() - started
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line and "self" not in line:
            self_us, cumulative_us, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
            rows.append((int(self_us), int(cumulative_us), name.strip()))
    total = max(c for _, c, _ in rows)
    return {
        "module": module,
        "process_wall_s": round(wall, 2),
        "import_total_s": round(total / 1e6, 2),
        "slowest_self": [{"module": n, "self_ms": round(s / 1000, 1)} for s, _, n in sorted(rows, reverse=True)[:top]],
    }


def server_pss(command: list[str]) -> dict[str, float]:
    """PSS/RSS of one idle stdio server a second after its handshake."""

    async def run() -> dict[str, float]:
        env = McpEnv(servers={"s": {"command": command[0], "args": command[1:], "cwd": str(ROOT)}},
                     workspace_root=Path(tempfile.mkdtemp()), pool_size=0)  # fmt: skip
        await env.init_rollout("r")
        await asyncio.sleep(1)  # let lazy allocations settle before reading memory
        pid = env.server_pids("r")["s"]
        assert pid is not None
        mem = smaps(pid)
        await env.shutdown()
        return {"pss_mb": round(mem["pss_kb"] / 1024, 1), "rss_mb": round(mem["rss_kb"] / 1024, 1)}

    return asyncio.run(run())


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for mode, result in report["modes"].items():
        for label, values in result["init_latency"]["raw_s"].items():
            ms = sorted(v * 1000 for v in values)
            axes[0].plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], marker=".", label=f"{mode}, {label}")
        cap = result["capacity"]
        axes[1].hist([p / 1024 for p in cap["per_server_pss_kb"]], bins=30, alpha=0.6,
                     label=f"{mode}: {cap['held_concurrently']} servers")  # fmt: skip
        curve = cap["curve"]
        axes[2].plot([c["servers"] for c in curve], [c["mem_available_kb"] / 1024 / 1024 for c in curve], marker=".",
                     label=mode)  # fmt: skip
    axes[0].set(xscale="log", xlabel="init_rollout latency (ms, log)", ylabel="fraction", title="init latency")
    axes[1].set(xlabel="PSS per server (MB)", ylabel="servers", title="calculator servers held at once")
    axes[2].set(xlabel="servers held", ylabel="MemAvailable (GiB)", title="machine memory as servers start")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000, help="forked isolated servers to hold at once")
    parser.add_argument("--plain-servers", type=int, default=200, help="plainly started servers to hold at once")
    parser.add_argument("--samples", type=int, default=30, help="inits per latency measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # fallbacks show
    OUT.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="gymflow-bench-"))
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "mem_total_gb": round(
        int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1)}}  # fmt: skip
    forks = node_fork_servers()
    report["modes"] = {}
    for mode, target in (("plain", args.plain_servers), ("fork", args.servers)):
        forks.close()
        forks.switch = mode == "fork"
        latency = asyncio.run(init_latency(root / mode, args.samples))
        print(mode, "init latency", {k: v for k, v in latency.items() if k != "raw_s"}, flush=True)
        held = asyncio.run(capacity(root / mode, target))
        print(mode, "capacity", {k: v for k, v in held.items() if k not in {"curve", "per_server_pss_kb"}}, flush=True)
        report["modes"][mode] = {"init_latency": latency, "capacity": held}
    forks.close()
    forks.switch = None
    report["profile"] = {
        "import_layers": layer_profile(),
        "imports_gymflow_calculator": import_profile(sys.executable, "gymflow.envs.builtin.math.servers.calculator"),
        "idle_server_gymflow_calculator_mcp2": server_pss(
            ["python", "-m", "gymflow.envs.builtin.math.servers.calculator"]
        ),
    }
    if THIRD_PARTY.exists():
        report["profile"]["idle_server_pypi_calculator_mcp1"] = server_pss([str(THIRD_PARTY)])
        report["profile"]["imports_pypi_calculator_mcp1"] = import_profile(
            str(THIRD_PARTY.parent / "python"), "mcp_server_calculator.calculator"
        )
    print("profile", json.dumps(report["profile"], indent=1))
    (OUT / "mcp_isolation.json").write_text(json.dumps(report, indent=2))
    plot(report, OUT / "mcp_isolation.png")
    print(f"wrote {OUT / 'mcp_isolation.json'} and {OUT / 'mcp_isolation.png'}")


if __name__ == "__main__":
    main()
