"""What the in-process worker of `gymflow eval` costs to start: `python -m bench.worker_start`.

Each sample is a fresh interpreter that does what `gymflow eval math` does before its first
rollout: import the eval command's module, connect to the server, and start its in-process worker
on a queue of its own (with the roles the command asks for). It reports the seconds from the first
gymflow import until the worker polls, the seconds `running_worker` itself took to enter, and the
process's resident memory (VmRSS, VmHWM) once it polls. The server is the embedded dev server,
started once for every sample. Results: bench/results/worker_start.json (`--label` names the run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "worker_start.json"


def _rss_kib() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmRSS", "VmHWM"}:
            fields[key] = int(value.split()[0])
    return fields


async def _sample(address: str, data_dir: str) -> dict[str, Any]:
    started = time.perf_counter()
    from gymflow.workers.client import connect, data_converter
    from gymflow.workers.config import Settings
    from gymflow.workers.roles import COMMAND_ROLES
    from gymflow.workers.sdk import evals  # what `gymflow eval` imports

    imported = time.perf_counter()
    settings = Settings(temporal_address=address, data_dir=Path(data_dir), mcp_pool_size=0)
    client = await connect(address, data_converter=data_converter(settings))
    connected = time.perf_counter()
    async with evals.running_worker(client, settings.command_queue("eval"), roles=COMMAND_ROLES["eval"]):
        polling = time.perf_counter()
        memory = _rss_kib()
    return {
        "to_polling_s": round(polling - started, 4),
        "imports_s": round(imported - started, 4),
        "worker_enter_s": round(polling - connected, 4),
        "rss_mib": round(memory["VmRSS"] / 1024, 1),
        "peak_rss_mib": round(memory["VmHWM"] / 1024, 1),
    }


def _one(address: str, data_dir: str) -> dict[str, Any]:
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-m", "bench.worker_start", "--sample", address, "--data-dir", data_dir],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"sample failed ({out.returncode}): {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


async def _run(samples: int, label: str) -> dict[str, Any]:
    from bench.procs import Procs, start_server

    procs = Procs()
    with tempfile.TemporaryDirectory() as work:
        try:
            address = await start_server(procs, Path(work) / "server", extra_args=[])
            _one(address, work)  # warm the OS page cache and the bytecode cache once
            runs = [await asyncio.to_thread(_one, address, work) for _ in range(samples)]
        finally:
            procs.stop_all()
    summary = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    return {"label": label, "samples": samples, "median": summary, "runs": runs, "date": time.strftime("%Y-%m-%d")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--label", default="current")
    parser.add_argument("--sample", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample:
        print(json.dumps(asyncio.run(_sample(args.sample, args.data_dir))), flush=True)
        os._exit(0)  # the measurement is out; skip the SDK runtime's teardown
    result = asyncio.run(_run(args.samples, args.label))
    recorded = json.loads(OUT.read_text()) if OUT.exists() else {}
    recorded[args.label] = result
    OUT.write_text(json.dumps(recorded, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))


if __name__ == "__main__":
    main()
