"""`gymflow train launch`: the run config is checked before anything starts (no server needed for
a refusal), and the shipped example configs pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mcp_support import ROOT

from gymflow.activities.training_checks import check_config
from gymflow.envs.errors import ConfigError
from gymflow.workers.cli.main import main
from gymflow.workers.sdk.training import load_run_config

EXAMPLES = ROOT / "envs" / "examples"


def test_the_example_run_configs_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    local = load_run_config(EXAMPLES / "train_math.yaml")
    assert local.trainer.backend == "local" and local.baseline.policy == "softmax" and local.eval.tasks >= 100
    assert check_config(local) == []
    assert check_config(load_run_config(EXAMPLES / "train_math_skyrl.yaml"), require_skypilot=False) == []


def write(tmp_path: Path, **changes: object) -> Path:
    config = yaml.safe_load((EXAMPLES / "train_math.yaml").read_text()) | changes
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trainer": {"resources": {"cpuz": 4}}}, "trainer.resources.cpuz: Extra inputs are not permitted"),
        ({"trainer": {"resources": {"accelerators": "H100:banana"}}}, "must be NAME or NAME:COUNT"),
        ({"trainer": {"resources": {"memory": -1}}}, "trainer.resources.memory"),
        ({"run_id": "../etc"}, "run_id: Value error, use 1-100 letters"),
        ({"baseline": {"policy": "softmax", "base_url": "http://x/v1"}}, "exactly one of 'policy'"),
        ({"algorithm": {"group_size": 0}}, "algorithm.group_size"),
    ],
)
def test_an_invalid_field_is_named(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"run\.yaml") as info:
        load_run_config(write(tmp_path, **changes))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"env": "no-such-env"}, "env: unknown env 'no-such-env'"),
        ({"trainer": {"resources": {"cpus": "4096+"}}}, "trainer.resources.cpus: the local backend has"),
        ({"trainer": {"resources": {"accelerators": "H100:8"}}}, "the local backend has no accelerators"),
        ({"trainer": {"command": ["no-such-trainer"]}}, "trainer.command: cannot find 'no-such-trainer'"),
        ({"baseline": {"policy": "oracle"}}, "baseline.policy: math has no baseline policy 'oracle'"),
    ],
)
def test_launch_refuses_a_bad_config_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object], message: str
) -> None:
    # No server listens at this address: a refusal must come before any connection.
    code = main(["train", "launch", str(write(tmp_path, **changes)), "--address", "127.0.0.1:1", "--wait"])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_every_field_at_fault_is_named_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A shape error (pydantic) does not hide the content errors (env, resources) behind it."""
    path = write(tmp_path, env="mathh", algorithm={"steps": -1}, trainer={"resources": {"cpus": 4096, "cpuz": 1}})
    code = main(["train", "launch", str(path), "--address", "127.0.0.1:1", "--wait"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    for problem in ("algorithm.steps: Input should be greater than or equal to 0",
                    "trainer.resources.cpuz: Extra inputs are not permitted", "env: unknown env 'mathh'",
                    "trainer.resources.cpus: the local backend has"):  # fmt: skip
        assert problem in err, err
    # With the env right, its baseline policy is checked too, beside the other problems.
    path = write(tmp_path, algorithm={"steps": -1}, baseline={"policy": "oracle"})
    assert main(["train", "launch", str(path), "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.steps" in err and "baseline.policy: math has no baseline policy 'oracle'" in err, err
    # A required field at fault leaves nothing to check further: the shape problems alone.
    path = write(tmp_path, baseline={"policy": "softmax", "base_url": "http://x/v1"}, env="mathh")
    assert main(["train", "launch", str(path), "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "exactly one of 'policy'" in err and "unknown env" not in err, err


def test_local_dryrun_prints_the_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["train", "launch", "envs/examples/train_math.yaml", "--dryrun"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert (
        shown["command"] == ["python", "-m", "gymflow.workers.trainers.reference"]
        and shown["run_id"] == "math-reference"
    )
