"""Every SkyPilot task YAML in deploy/ parses with the real skypilot package (`sky.Task.from_yaml`),
as the launchers render it too; `--dryrun` prints the trainer's task without skypilot.

skypilot is heavy, so it lives in its own venv (`.venv-skypilot`, which .ci/run installs; or
GYMFLOW_SKYPILOT_PYTHON names another interpreter); these tests skip, saying so, without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mcp_support import ROOT

from gymflow.activities import trainer_backends as backends
from gymflow.deploy import launcher
from gymflow.workers.cli.main import main

DEPLOY = ROOT / "deploy"
TASKS = sorted(DEPLOY.glob("*.yaml"))
SKY_PYTHON = Path(os.environ.get("GYMFLOW_SKYPILOT_PYTHON", ROOT / ".venv-skypilot" / "bin" / "python"))
CHECK = """
import json, sys
import sky
for path, config, valid in json.load(sys.stdin):
    try:
        task = sky.Task.from_yaml(path) if config is None else sky.Task.from_yaml_config(config)
    except Exception as exc:
        print(path, "REFUSED" if not valid else "FAILED", type(exc).__name__, str(exc).splitlines()[0])
    else:
        print(path, "OK" if valid else "ACCEPTED", task.name, sorted(str(r) for r in task.resources))
"""

needs_sky = pytest.mark.skipif(
    not SKY_PYTHON.is_file(),
    reason=f"skypilot is not installed at {SKY_PYTHON} (python3 -m venv .venv-skypilot && "
    ".venv-skypilot/bin/pip install 'skypilot==0.14.1'; .ci/run does it)",
)


def sky_parse(items: list[tuple[str, dict[str, object] | None, bool]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SKY_PYTHON), "-c", CHECK], input=json.dumps(items), capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=False)  # fmt: skip


def test_deploy_holds_the_worker_fleet_and_the_trainer_tasks() -> None:
    assert {p.name for p in TASKS} >= {"workers.yaml", "trainer_skyrl.yaml"}


@needs_sky
def test_every_task_yaml_in_deploy_parses_with_real_skypilot() -> None:
    """One interpreter (importing sky takes a while): each file as is, as rendered, and a bad one."""
    fleet = launcher.task_config(launcher.FleetSpec(nodes=3, temporal_address="t:7233", task_queue="q", infra="aws"))
    trainer = backends.task_config(DEPLOY / "trainer_skyrl.yaml", env={"GYMFLOW_RUN_ID": "r1"},
                                   resources={"accelerators": "H100:8"})  # fmt: skip
    bad = backends.task_config(DEPLOY / "trainer_skyrl.yaml", env={}, resources={"accelerators": "H100:lots"})
    items: list[tuple[str, dict[str, object] | None, bool]] = [(str(p), None, True) for p in TASKS]
    items += [("rendered workers", fleet, True), ("rendered trainer", trainer, True), ("bad accelerators", bad, False)]
    result = sky_parse(items)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == len(items) and all(" OK " in line or " REFUSED " in line for line in lines), lines
    assert "H100" in lines[-2] and "gymflow-trainer-skyrl" in lines[-2]
    assert "accelerators" in lines[-1]


def test_train_dryrun_prints_the_trainer_task_without_skypilot(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)  # importing it fails, as where skypilot is absent
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.chdir(ROOT)
    code = main(["train", "launch", "envs/examples/train_math_skyrl.yaml", "--dryrun", "--run-id", "r-7",
                 "--address", "temporal.internal:7233"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "hf-secret" not in out
    assert out.startswith("# SkyPilot task of run r-7 (cluster gymflow-train-r-7)")
    task = yaml.safe_load(out)
    assert (
        task["envs"]["GYMFLOW_RUN_ID"] == "r-7" and task["envs"]["GYMFLOW_TEMPORAL_ADDRESS"] == "temporal.internal:7233"
    )
    assert task["resources"]["accelerators"] == "L4:1" and task["secrets"] == {"HF_TOKEN": "<redacted>"}
    assert "gymflow.workers.trainers.skyrl train" in task["run"]


def test_train_launch_without_skypilot_says_how_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)
    monkeypatch.chdir(ROOT)
    assert main(["train", "launch", "envs/examples/train_math_skyrl.yaml"]) == 2
    assert "pip install 'gymflow[skypilot]'" in capsys.readouterr().err
