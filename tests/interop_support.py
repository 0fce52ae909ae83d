"""What the env-package and interop tests share: the installed test packages, `gymflow eval` on
them, their trajectories, and the other projects' own runners (tests/envs/packages/references)
run with a package's python."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from env_packages import PACKAGES, PACKAGES_ROOT, SCRIPT, installed
from temporalio.client import Client

from gymflow.activities.schema import BatchResult
from gymflow.activities.storage import read_trajectories
from gymflow.envs.contract import Trajectory
from gymflow.envs.packages import launch, store
from gymflow.envs.packages.store import PackageRecord
from gymflow.workers.cli.main import main

REFERENCES = Path(__file__).parent / "envs" / "packages" / "references"


def require(*keys: str) -> None:
    """Skip, naming the script that installs them, unless packages `keys` are installed from their sources."""
    missing = [key for key in keys if not installed(key)]
    if missing:
        pytest.skip(
            f"env packages {', '.join(missing)} are not installed in {PACKAGES_ROOT}: run `{SCRIPT}` (.ci/run does)"
        )


def record_of(key: str) -> PackageRecord:
    (record,) = store.find_package(PACKAGES[key].distribution)
    return record


async def gymflow_eval(
    client: Client, address: str, tmp_path: Path, env: str, *, n: int, policy: str = "reference"
) -> tuple[dict[str, Any], list[Trajectory]]:
    """`gymflow eval ENV --policy POLICY --n N` (the CLI, with its own worker on a fresh queue): its
    report and the batch's trajectories."""
    out = tmp_path / f"eval-{env}"
    argv = ["eval", env, "--policy", policy, "--n", str(n), "--reps", "200", "--out", str(out), "--json",
            "--address", address, "--task-queue", f"eval-{uuid.uuid4().hex[:8]}"]  # fmt: skip
    code = await asyncio.to_thread(main, argv)
    assert code == 0, f"gymflow eval {env} exited {code}"
    report = json.loads((out / "report.json").read_text())
    (batch,) = report["batches"]
    result = await client.get_workflow_handle(batch["batch_id"], result_type=BatchResult).result()
    return report, await read_trajectories(result.parts)


def run_reference(record: PackageRecord, script: str, job: dict[str, Any], *, timeout_s: float = 300) -> Any:
    """Run a reference script (tests/envs/packages/references) with the package's python, in the env
    the bridge gets (the package's venv first on PATH), in a process group that is killed after."""
    env = {**os.environ, **launch.bridge_env(record, None, target="-")}
    # In a directory of its own, as the bridge runs in the rollout's workspace: envs write relative
    # paths (benchmax's workspaces, the tests' notes) that must not land in the checkout.
    with tempfile.TemporaryDirectory(prefix="gymflow-reference-") as cwd:
        process = subprocess.Popen(
            [str(record.python_path), str(REFERENCES / script)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True, cwd=cwd,
        )  # fmt: skip
        try:
            out, err = process.communicate(json.dumps(job), timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def venv_processes(record: PackageRecord) -> list[str]:
    """Command lines of live processes that run from the package's venv (its bridge, its servers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(record.venv) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def tool_calls(trajectory: Trajectory) -> list[tuple[str, dict[str, Any]]]:
    return [(call.name, call.arguments) for m in trajectory.messages for call in m.tool_calls]


class Driver:
    """OpenEnv's `GenericEnvClient` in the OpenEnv package's venv, one command per line."""

    def __init__(self, python: Path, url: str) -> None:
        self.process = subprocess.Popen(
            [str(python), str(REFERENCES / "openenv_driver.py"), url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    async def send(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 300)
        return dict(json.loads(line))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
