"""gymflow installs under one namespace: a built wheel beside a user's own `workflows.py`, `activities.py`, `envs/`.

A user's project (Temporal's own template keeps `workflows.py` and `activities.py` at its root,
OpenEnv a top-level `envs/`) must not shadow gymflow, nor gymflow it. The wheel is built from this
checkout and installed (not editable) into a fresh venv whose dependencies come from the test
venv's site-packages by a path entry; gymflow itself comes only from the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLD_ROOTS = {"envs", "activities", "workflows", "workers", "deploy"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return next(out.glob("gymflow-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; returns its python."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, with_pip=False)
    python = home / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    # Dependencies from this venv, added after the install so pip never saw them (nor this venv's gymflow).
    (purelib / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert tops == {"gymflow"}
    assert "gymflow/py.typed" in names
    assert "gymflow/workflows/rollout.py" in names
    assert any(n.startswith("gymflow/envs/builtin/search/sample_corpus/") for n in names)


def test_site_packages_has_no_old_top_level_names(installed: Path) -> None:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    purelib = installed.parent.parent / "lib" / version / "site-packages"
    assert (purelib / "gymflow").is_dir()
    assert not OLD_ROOTS & {p.name for p in purelib.iterdir()}


def user_project(root: Path) -> Path:
    """A project with gymflow's old top-level names as its own modules."""
    project = root / "myproject"
    (project / "envs").mkdir(parents=True)
    (project / "envs" / "__init__.py").write_text("MINE = 'envs'\n")
    (project / "workflows.py").write_text("MINE = 'workflows'\n")
    (project / "activities.py").write_text("MINE = 'activities'\n")
    (project / "workers.py").write_text("MINE = 'workers'\n")
    return project


def test_user_modules_and_gymflow_side_by_side(installed: Path, tmp_path: Path) -> None:
    project = user_project(tmp_path)
    code = (
        "import activities, envs, workers, workflows\n"
        "import gymflow\n"
        "from gymflow import BaseEnv, McpEnv, ModelConfig, RolloutInput, Task\n"
        "from gymflow.workflows.rollout import RolloutWorkflow\n"
        "assert (envs.MINE, workflows.MINE, activities.MINE, workers.MINE) == "
        "('envs', 'workflows', 'activities', 'workers')\n"
        "assert 'site-packages' in gymflow.__file__, gymflow.__file__\n"
        "assert sorted(gymflow.__all__) == gymflow.__all__ and 'connect' in gymflow.__all__\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [str(installed), "-c", code], cwd=project, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.heavy
def test_rollouts_run_from_the_user_project(installed: Path, tmp_path: Path, temporal_address: str) -> None:
    """`python -m gymflow.workers.cli rollout` from the project dir (its cwd first on sys.path): real rollouts."""
    project = user_project(tmp_path)
    env = {**os.environ, "GYMFLOW_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        [str(installed), "-m", "gymflow.workers.cli", "rollout", "math", "--n", "2", "--json",
         "--address", temporal_address],
        cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    rollouts = report["rollouts"] if isinstance(report, dict) else report
    assert len(rollouts) == 2
    assert all(r["reward"] == 1.0 for r in rollouts), rollouts
