"""One Temporal server per data directory: a second start is refused and says where the first runs.

Real `temporal server start-dev` processes on free ports, started as users start them (`gymflow
server --background`, `gymflow server` in the foreground, the demo's own start). `--stop` stops
the data dir's own server, and a server that died outright (SIGKILL) leaves no stale lock.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gymflow.envs.mcp.http import free_port
from gymflow.workers.client import connect
from gymflow.workers.servers import temporal as embedded
from support import process_alive

ROOT = Path(__file__).parents[2]


def gymflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", *args], capture_output=True, text=True, timeout=100, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip


def released(data: Path, timeout_s: float) -> bool:
    """Whether `data`'s server lock is free within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while embedded.running(data) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def reachable(port: int) -> None:
    await embedded.wait_until_reachable(lambda: connect(f"127.0.0.1:{port}"), timeout_s=60)


@pytest.mark.heavy
async def test_a_second_server_on_one_data_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port, other, third = free_port(), free_port(), free_port()
    started = await asyncio.to_thread(gymflow, "server", "--background", "--port", str(port), "--data-dir", str(data),
                                      cwd=tmp_path)  # fmt: skip
    assert started.returncode == 0, started.stderr
    record = json.loads((data / "server.json").read_text())
    pid = record["pid"]
    try:
        await reachable(port)
        where = f"(pid {pid}, frontend localhost:{port}, UI http://localhost:{port + 1000})"
        for args in (
            ["server", "--background", "--port", str(other)],  # detached
            ["server", "--port", str(other)],  # in the foreground: refused before it becomes the server
            ["demo", "--n", "1", "--address", f"localhost:{third}"],  # the demo starts one when none answers
        ):
            refused = await asyncio.to_thread(gymflow, *args, "--data-dir", str(data), cwd=tmp_path)
            last = refused.stderr.strip().splitlines()[-1]
            assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
            assert f"a Temporal server already runs on data dir {data} {where}" in last, last
            assert f"--address localhost:{port}" in last
        assert not listening(other) and not listening(third)  # no second server came up
        assert json.loads((data / "server.json").read_text()) == record  # nor overwrote the record
        # --stop with another server's port stops nothing; with its own, it stops it.
        wrong = await asyncio.to_thread(gymflow, "server", "--stop", "--port", str(other), "--data-dir", str(data),
                                        cwd=tmp_path)  # fmt: skip
        assert wrong.returncode == 2 and f"stop it with --port {port}" in wrong.stderr, wrong.stderr
        assert process_alive(pid)
        stopped = await asyncio.to_thread(gymflow, "server", "--stop", "--port", str(port), "--data-dir", str(data),
                                          cwd=tmp_path)  # fmt: skip
        assert stopped.returncode == 0 and "server stopped" in stopped.stderr, stopped.stderr
        assert not process_alive(pid) and embedded.running(data) is None
    finally:
        embedded.stop_background(data_dir=data)


@pytest.mark.heavy
async def test_a_killed_server_leaves_no_stale_lock_and_a_foreground_one_holds_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port, other = free_port(), free_port()
    pid = embedded.start_background(data_dir=data, port=port, ui_port=free_port())
    try:
        await reachable(port)
        os.killpg(pid, signal.SIGKILL)  # no shutdown at all
        assert await asyncio.to_thread(released, data, 30)  # the kernel drops the lock with the process
        # In the foreground (`gymflow server` becomes the server process): it takes the lock.
        foreground = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gymflow.workers.cli", "server", "--port", str(other), "--data-dir", str(data),
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await reachable(other)
            running = embedded.running(data)
            assert running is not None and (running.pid, running.port) == (foreground.pid, other)
            refused = await asyncio.to_thread(gymflow, "server", "--background", "--data-dir", str(data),
                                              "--port", str(port), cwd=tmp_path)  # fmt: skip
            assert refused.returncode == 2 and f"pid {foreground.pid}" in refused.stderr, refused.stderr
            stopped = await asyncio.to_thread(gymflow, "server", "--stop", "--data-dir", str(data), cwd=tmp_path)
            assert stopped.returncode == 0 and "server stopped" in stopped.stderr, stopped.stderr
            assert await asyncio.wait_for(foreground.wait(), 30) is not None
        finally:
            if foreground.returncode is None:
                foreground.kill()
                await foreground.wait()
    finally:
        embedded.stop_background(data_dir=data)
