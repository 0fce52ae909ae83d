"""Worker fleets: the SkyPilot task (printed without skypilot installed, launched through its
Python API) and the local backend, which runs the task's very run script as N local workers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp_support import ROOT, node_ids, wait_polling
from temporalio.client import Client

from gymflow.activities.names import node_queue
from gymflow.deploy import launcher
from gymflow.envs.mcp.ledger import pid_alive
from gymflow.workers.cli.main import main


def test_dryrun_prints_the_task_without_skypilot(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)  # importing it fails, as where skypilot is absent
    monkeypatch.setenv("GYMFLOW_MODEL_API_KEY", "sk-secret")
    code = main(["deploy", "workers", "--nodes", "4", "--infra", "gcp/us-central1", "--dryrun",
                 "--address", "temporal.internal:7233", "--task-queue", "rl"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "sk-secret" not in out
    task = yaml.safe_load(out)
    assert task["num_nodes"] == 4 and task["resources"]["infra"] == "gcp/us-central1"
    assert task["envs"]["GYMFLOW_TEMPORAL_ADDRESS"] == "temporal.internal:7233"
    assert task["envs"]["GYMFLOW_TASK_QUEUE"] == "rl"
    assert task["secrets"] == {"GYMFLOW_MODEL_API_KEY": "<redacted>"}
    assert "SKYPILOT_NODE_RANK" in task["run"] and "gymflow worker" in task["run"]


def test_without_skypilot_launch_says_how_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)
    assert main(["deploy", "workers", "--nodes", "2"]) == 2
    assert "pip install 'gymflow[skypilot]'" in capsys.readouterr().err
    assert main(["deploy", "workers", "--nodes", "0", "--dryrun"]) == 2
    assert "--nodes must be at least 1" in capsys.readouterr().err


def test_skypilot_launch_and_down_use_the_request_api(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class Task:
        @staticmethod
        def from_yaml_config(config: dict[str, Any]) -> Task:
            calls.append(("task", config))
            return Task()

    fake = types.ModuleType("sky")
    fake.Task = Task  # type: ignore[attr-defined]
    fake.launch = lambda task, cluster_name: calls.append(("launch", cluster_name)) or "req-launch"  # type: ignore[attr-defined]
    fake.down = lambda cluster_name: calls.append(("down", cluster_name)) or "req-down"  # type: ignore[attr-defined]
    fake.stream_and_get = lambda request_id: calls.append(("get", request_id)) or (7, object())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sky", fake)
    spec = launcher.FleetSpec(nodes=3, temporal_address="t:7233", task_queue="q", cluster="fleet")
    assert launcher.launch_skypilot(spec) == 7
    launcher.down_skypilot("fleet")
    assert [c[0] for c in calls] == ["task", "launch", "get", "down", "get"]
    assert calls[0][1]["num_nodes"] == 3 and calls[1] == ("launch", "fleet") and calls[2] == ("get", "req-launch")


def local_spec(temporal_address: str, tmp_path: Path, nodes: int) -> launcher.FleetSpec:
    return launcher.FleetSpec(
        nodes=nodes,
        temporal_address=temporal_address,
        task_queue=f"fleet-{tmp_path.name}",
        env={"GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "ws"), "GYMFLOW_MCP_POOL_SIZE": "1"},
    )


@pytest.mark.heavy
async def test_local_backend_starts_and_stops_a_worker(client: Client, temporal_address: str, tmp_path: Path) -> None:
    spec = local_spec(temporal_address, tmp_path, nodes=1)
    (node,) = launcher.launch_local(spec, data_dir=tmp_path, workdir=ROOT)
    try:
        await wait_polling(client, [node_queue(spec.task_queue, node_ids(1)[0])])
        with pytest.raises(RuntimeError, match="already running"):
            launcher.launch_local(spec, data_dir=tmp_path, workdir=ROOT)
    finally:
        stopped = await asyncio.to_thread(launcher.down_local, data_dir=tmp_path)
    assert stopped == [node.pid] and not Path(f"/proc/{node.pid}").exists()
    assert list((tmp_path / "workers").glob("*.json")) == []


def test_a_child_that_exited_counts_as_stopped_and_is_reaped() -> None:
    running = subprocess.Popen(["sleep", "30"])
    exited = subprocess.Popen(["true"])
    try:
        stat = Path(f"/proc/{exited.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # wait until it is a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert pid_alive(running.pid)
        assert not pid_alive(exited.pid) and not stat.exists()  # reaped, not left behind
    finally:
        running.kill()
        running.wait()


def test_a_process_whose_main_thread_is_done_but_another_runs_is_alive() -> None:
    # What a stopping worker looks like for a moment: /proc/PID/stat (the main thread) reads Z
    # while the Temporal core's threads wind down. It must not count as stopped yet.
    script = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(1), print('done', flush=True))).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # the main thread has exited
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert pid_alive(child.pid)
        assert child.stdout is not None and child.stdout.readline() == b"done\n"
        while pid_alive(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert not stat.exists()
    finally:
        child.kill()
