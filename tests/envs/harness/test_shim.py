"""The container-engine shim hands an agent the rollout's container: `run` names it, `exec` runs there
whatever container id it is given, cleanup is a no-op, anything else is refused (exit 125)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gymflow.envs.harness.shim import CONTAINER_VAR, ENGINE_VAR, install

ENGINE = """#!{python}
import json, sys
print(json.dumps(sys.argv[1:]))
"""


@pytest.fixture
def shim(tmp_path: Path) -> dict[str, str]:
    engine = tmp_path / "engine"  # stands in for podman: prints the argv it got
    engine.write_text(ENGINE.format(python=sys.executable))
    engine.chmod(0o755)
    bin_dir = install(tmp_path / "bin")
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", CONTAINER_VAR: "gymflow-abc", ENGINE_VAR: str(engine)}


def docker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=30, check=False)


def test_run_names_the_rollouts_container_and_cleanup_does_nothing(shim: dict[str, str]) -> None:
    started = docker(shim, "run", "-d", "--name", "minisweagent-1", "-w", "/app", "--rm", "task-image", "sleep", "2h")
    assert started.returncode == 0 and started.stdout.strip() == "gymflow-abc"
    for cleanup in (["stop", "gymflow-abc"], ["rm", "-f", "gymflow-abc"]):
        done = docker(shim, *cleanup)
        assert done.returncode == 0 and done.stdout == ""


def test_exec_runs_in_the_rollouts_container_keeping_its_options(shim: dict[str, str]) -> None:
    ran = docker(
        shim, "exec", "-w", "/app", "-e", "PAGER=cat", "--env=A=b c", "-i", "whatever-id", "bash", "-lc", "ls -la"
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == ["exec", "-w", "/app", "-e", "PAGER=cat", "--env=A=b c", "-i", "gymflow-abc",
                                      "bash", "-lc", "ls -la"]  # fmt: skip


@pytest.mark.parametrize("args", [["pull", "ubuntu"], ["exec", "--privileged-mode", "x", "ls"], ["exec", "x"], []])
def test_anything_else_is_refused(shim: dict[str, str], args: list[str]) -> None:
    refused = docker(shim, *args)
    assert refused.returncode == 125 and "gymflow engine shim" in refused.stderr


def test_outside_a_rollout_the_shim_says_so(shim: dict[str, str]) -> None:
    env = {k: v for k, v in shim.items() if k != CONTAINER_VAR}
    refused = docker(env, "exec", "x", "ls")
    assert refused.returncode == 125 and "outside a rollout" in refused.stderr
