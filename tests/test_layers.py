"""The layers of the house, as the import linter checks them (pyproject.toml's [tool.importlinter]).

The real tree keeps every contract; a scratch copy of it with one deliberate back-arrow, circle or
unplaced module breaks the contract that names it, and `lint-imports` says which. The copy is
found before the installed gymflow (PYTHONPATH), so the linter reads the changed files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("gymflow", "envs", "activities", "workflows", "workers", "deploy")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed: pip install -e '.[dev]'"
)


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A copy of the source tree (gymflow/'s links to the five folders kept as links) and pyproject.toml."""
    for name in PACKAGES:
        shutil.copytree(
            ROOT / name,
            tmp_path / name,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.yaml", "*.json*"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_tree_keeps_every_contract() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_scratch_copy_is_what_the_linter_reads(scratch: Path) -> None:
    result = lint(scratch)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_error_type_importing_a_worker_breaks_the_layers(scratch: Path) -> None:
    append(scratch / "envs" / "errors.py", "from gymflow.workers.servers.temporal import ServerRecord  # noqa")
    result = lint(scratch)
    assert result.returncode == 1
    out = " ".join(result.stdout.split())
    assert "The four layers: workers (and the fleet launcher) over workflows over activities over envs BROKEN" in out
    assert "The env contract stands alone" in out and "gymflow.envs.errors -> gymflow.workers.servers.temporal" in out


def test_an_activity_importing_a_workflow_breaks_the_layers(scratch: Path) -> None:
    append(scratch / "activities" / "storage.py", "from gymflow.workflows import status  # noqa")
    out = " ".join(lint(scratch).stdout.split())
    assert "gymflow.activities is not allowed to import gymflow.workflows" in out
    assert "gymflow.activities.storage -> gymflow.workflows.status" in out


def test_the_contract_importing_an_env_kind_breaks_the_envs_layers(scratch: Path) -> None:
    append(scratch / "envs" / "contract.py", "from gymflow.envs.mcp import env as _mcp_env  # noqa")
    out = " ".join(lint(scratch).stdout.split())
    assert "Inside envs: name resolution over env kinds" in out and "BROKEN" in out
    assert "gymflow.envs.contract -> gymflow.envs.mcp.env" in out


def test_a_circle_inside_a_layer_breaks_acyclic(scratch: Path) -> None:
    # activities.errors is imported by activities.model; closing the loop is a circle between siblings
    append(scratch / "activities" / "errors.py", "from gymflow.activities import model as _model  # noqa")
    result = lint(scratch)
    out = " ".join(result.stdout.split())
    assert result.returncode == 1 and "5 kept, 1 broken" in out
    assert "No cycles are allowed in gymflow.activities" in out and ".errors -> .model" in out


def test_temporalio_in_the_env_contract_is_refused(scratch: Path) -> None:
    append(scratch / "envs" / "contract.py", "import temporalio  # noqa")
    out = " ".join(lint(scratch).stdout.split())
    assert "The env contract stands alone" in out and "gymflow.envs.contract -> temporalio" in out


def test_io_in_workflow_code_is_refused(scratch: Path) -> None:
    append(scratch / "workflows" / "budget.py", "import subprocess  # noqa")
    out = " ".join(lint(scratch).stdout.split())
    assert "Workflow code does no I/O" in out and "gymflow.workflows.budget -> subprocess" in out


def test_a_new_module_must_take_a_place_in_its_layers(scratch: Path) -> None:
    (scratch / "envs" / "newthing.py").write_text('"""A module nobody placed."""\n')
    out = " ".join(lint(scratch).stdout.split())
    assert "BROKEN" in out and "gymflow.envs.newthing" in out
