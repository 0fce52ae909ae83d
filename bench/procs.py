"""The processes of a benchmark run: dev server, policy endpoint, workers; their CPU time and the load.

Each runs as its own process, as in a deployment (the driver, which also runs the direct
baseline, is this process). CPU seconds per process are read from /proc, so every scenario
reports where the machine's time went, and the load average is recorded next to every figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from gymflow.workers.client import connect
from gymflow.workers.servers import temporal as embedded

ROOT = Path(__file__).resolve().parents[1]
_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICKS


def load() -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    return {"load1": round(one, 2), "load5": round(five, 2), "load15": round(fifteen, 2), "cpus": os.cpu_count() or 0}


CALIBRATION_LOOPS = 1_000_000


def calibration_ms() -> float:
    """Milliseconds this process takes for a fixed pure-Python loop, now: the box's speed at the time
    of a run (best of three, so a single preemption does not count). Runs of the same work whose CPU
    seconds differ while this does too were measured on a faster or slower machine, not a costlier run."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(CALIBRATION_LOOPS):
            total += i & 7
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


@dataclass
class Procs:
    """The running processes by role; `cpu()` snapshots their CPU seconds."""

    pids: dict[str, int] = field(default_factory=dict)
    popens: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cpu(self) -> dict[str, float]:
        snapshot = {"driver": cpu_seconds(os.getpid())}
        for role, pid in self.pids.items():
            with contextlib.suppress(OSError):
                snapshot[role] = cpu_seconds(pid)
        return snapshot

    def spawn(
        self, role: str, command: list[str], *, log: Path | None = None, **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        """Start `command` as `role`; its output goes to `log` (appended) when given."""
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as out:
                popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **kwargs)
        else:
            popen = subprocess.Popen(command, **kwargs)
        self.pids[role] = popen.pid
        self.popens.append(popen)
        return popen

    def stop(self, role: str) -> None:
        """Stop the process started as `role` (SIGTERM, then SIGKILL after 20 s)."""
        pid = self.pids.pop(role)
        for popen in [p for p in self.popens if p.pid == pid]:
            self.popens.remove(popen)
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()

    def stop_all(self) -> None:
        for popen in reversed(self.popens):
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
        for popen in reversed(self.popens):
            try:
                popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {role: round(after[role] - before.get(role, 0.0), 2) for role in after}


async def start_server(procs: Procs, data_dir: Path, *, extra_args: list[str], port: int | None = None) -> str:
    """The embedded dev server as `gymflow server` runs it (SQLite file, headless), on `port` or a free one."""
    port = port or free_port()
    command = embedded.dev_server_command(data_dir=data_dir, port=port, ui_port=free_port(), headless=True)
    procs.spawn("server", [*command, *extra_args], log=data_dir / "server.log")
    address = f"127.0.0.1:{port}"
    await embedded.wait_until_reachable(lambda: connect(address), timeout_s=60)
    return address


def fresh_servers(procs: Procs, work: Path, address: str, *, extra_args: list[str]) -> Callable[[], Awaitable[None]]:
    """What replaces the server (started under `work`) by a new one with an empty database at the
    same address; the workers and clients reconnect by themselves."""
    generation = itertools.count(1)
    port = int(address.rsplit(":", 1)[1])

    def stop_and_clear() -> None:
        procs.stop("server")
        for old in work.glob("server*"):
            shutil.rmtree(old, ignore_errors=True)

    async def fresh_server() -> None:
        await asyncio.to_thread(stop_and_clear)
        await start_server(procs, work / f"server-{next(generation)}", extra_args=extra_args, port=port)

    return fresh_server


async def start_policy(procs: Procs) -> str:
    """The benchmark policy endpoint in its own process; returns ``http://HOST:PORT``."""
    port = free_port()
    procs.spawn("policy", [sys.executable, "-m", "bench.workload", "--port", str(port)], cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient() as http:
        while True:
            try:
                await http.get(base + "/bench/stats")
                return base
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def start_worker(
    procs: Procs,
    role: str,
    *,
    mode: str,
    address: str,
    task_queue: str,
    env: Mapping[str, str] | None = None,
    code_root: Path | None = None,
) -> None:
    """A worker process; `code_root` runs another checkout's gymflow (a before/after variant)."""
    environ = {**os.environ, **(env or {})}
    if code_root is not None:
        environ["PYTHONPATH"] = os.pathsep.join([str(code_root), str(ROOT)])
    command = [sys.executable, "-m", "bench.worker", "--mode", mode]
    command += ["--address", address, "--task-queue", task_queue]
    popen = procs.spawn(role, command, cwd=code_root or ROOT, env=environ, stdout=subprocess.PIPE)
    assert popen.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(popen.stdout.readline), 120)
    if line.strip() != b"ready":
        raise RuntimeError(f"worker {role} did not start: {line!r}")


async def start_bare_and_gymflow(procs: Procs, work: Path) -> tuple[str, Client]:
    """A dev server, a bare worker (queue ``bench-bare``), a gymflow worker (``bench-gymflow``) and
    the benchmark policy endpoint; returns the endpoint's base URL and a client of the server."""
    address = await start_server(procs, work / "server", extra_args=[])
    await start_worker(procs, "bare", mode="bare", address=address, task_queue="bench-bare")
    await start_worker(procs, "gymflow", mode="gymflow", address=address, task_queue="bench-gymflow")
    policy = await start_policy(procs)
    return policy, await connect(address)


@contextlib.contextmanager
def measured(procs: Procs) -> Iterator[dict[str, object]]:
    """Wall time, CPU seconds per process and the load of the block, filled in on exit."""
    record: dict[str, object] = {"load_before": load(), "calibration_ms_before": calibration_ms()}
    cpu_before = procs.cpu()
    started = time.perf_counter()
    yield record
    record["wall_s"] = round(time.perf_counter() - started, 3)
    record["cpu_s"] = cpu_delta(cpu_before, procs.cpu())
    record["load_after"] = load()


@contextlib.contextmanager
def profiled(pid: int | None, out: Path | None) -> Iterator[None]:
    """Sample `pid` with py-spy (non-blocking, so the process runs at full speed) into `out`."""
    if pid is None or out is None or shutil.which("py-spy") is None:
        yield
        return
    rate = os.environ.get("GYMFLOW_BENCH_SPY_RATE", "100")  # samples per second
    command = ["py-spy", "record", "--pid", str(pid), "--nonblocking", "--rate", rate, "--format", "raw"]
    spy = subprocess.Popen([*command, "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
