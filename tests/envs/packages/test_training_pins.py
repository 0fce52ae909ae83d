"""Run configs pin env packages by version: a pin that is not installed fails validation with the
command that installs it, and a run's bundle carries every pinned package (record, lock, wheel), which
another node installs again, refusing code whose digest differs."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from interop_support import record_of, require

from gymflow.activities.bundle import build_bundle
from gymflow.activities.training_checks import check_config
from gymflow.workers.cli.main import main
from gymflow.workers.sdk.training import load_run_config

ROOT = Path(__file__).parents[3]


def run_config(tmp_path: Path, **changes: object) -> Path:
    config = yaml.safe_load((ROOT / "envs" / "examples" / "train_math.yaml").read_text())
    config |= {"env": "pinned-a", "dataset": {"uri": "generated"}, "baseline": {"policy": "reference"},
               "validation": {"smoke_policy": {"policy": "reference"}}, **changes}  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_pin_that_is_not_installed_fails_validation_with_the_install_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    require("pinned-a", "pinned-b")
    monkeypatch.chdir(ROOT)
    pins = {"gymflow-example-pinned-a": "9.9.9", "gymflow-example-pinned-b": "==2.0.0"}
    code = main(["train", "launch", str(run_config(tmp_path, env_packages=pins)), "--address", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        "env_packages.gymflow-example-pinned-a: version 9.9.9 is not installed on this node (installed: 1.0.0); "
        "install it with: gymflow envs install 'gymflow-example-pinned-a==9.9.9'"
    ) in err
    assert (
        "env: pinned-a runs gymflow-example-pinned-a 1.0.0, but env_packages pins 9.9.9: name the env pinned-a@9.9.9"
        in err
    )
    assert "pinned-b" not in err  # its pin is installed
    pinned = load_run_config(run_config(tmp_path, env_packages={"gymflow-example-pinned-a": "1.0.0"}))
    assert check_config(pinned) == []


def test_the_bundle_carries_every_pinned_package(tmp_path: Path) -> None:
    require("pinned-a", "pinned-b")
    bundle = build_bundle("pinned-a", {"gymflow-example-pinned-b": "2.0.0"})
    assert build_bundle("pinned-a", {"gymflow-example-pinned-b": "2.0.0"}).digest == bundle.digest  # reproducible
    for key, folder in (("pinned-a", "gymflow-example-pinned-a-1.0.0"), ("pinned-b", "gymflow-example-pinned-b-2.0.0")):
        record = record_of(key)
        carried = {p for p in bundle.files if p.startswith(f"env_packages/{folder}/")}
        wheel = next((record.directory / "dist").glob("*.whl"))
        assert carried == {f"env_packages/{folder}/{n}" for n in ("package.json", "requirements.lock", wheel.name)}
    with tarfile.open(fileobj=io.BytesIO(bundle.data)) as tar:
        root = tar.getnames()[0].split("/")[0]
        lock = tar.extractfile(f"{root}/env_packages/gymflow-example-pinned-b-2.0.0/requirements.lock")
        assert lock is not None and "six==1.17.0" in lock.read().decode().split()
        record = json.loads(tar.extractfile(f"{root}/env_packages/gymflow-example-pinned-a-1.0.0/package.json").read())  # type: ignore[union-attr]
    assert record["digest"] == record_of("pinned-a").digest and record["envs"][0]["name"] == "pinned-a"


@pytest.mark.slow
def test_a_bundled_package_installs_again_by_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a SkyPilot node does with the bundle: `gymflow envs install <bundle>/env_packages/NAME-VERSION`."""
    require("pinned-b")
    original = record_of("pinned-b")
    bundle = build_bundle("pinned-b")
    with tarfile.open(fileobj=io.BytesIO(bundle.data)) as tar:
        tar.extractall(tmp_path / "bundle", filter="data")
    (carried,) = (tmp_path / "bundle").glob("*/env_packages/gymflow-example-pinned-b-2.0.0")
    monkeypatch.setenv("GYMFLOW_ENV_PACKAGES_DIR", str(tmp_path / "node"))
    assert main(["envs", "install", str(carried)]) == 0
    from gymflow.envs.packages import store

    (again,) = store.records()
    assert (again.name, again.version, again.digest) == (original.name, original.version, original.digest)
    assert [d.name for d in again.envs] == ["pinned-b"] and again.envs[0].tasks == 4
    assert "six==1.17.0" in again.lock
