"""temporalio is pinned to the minor gymflow was tested with; bumping it means passing this file.

gymflow's fast workflow runner (gymflow.workers.sandbox_fast) subclasses the SDK runner's private
internals. A release that moved them would not stop a worker (it falls back to the SDK's stock
runner, tests/workers/test_sandbox_runner.py), but it would silently lose the fast path, so the pin
in pyproject.toml is one minor wide and these tests name, one by one, what the fast runner relies
on: a bump is made with this file passing (or the fast runner updated first).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from temporalio.worker.workflow_sandbox import _runner as sdk_runner

from gymflow.workers import sandbox_fast

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _requirement() -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [temporalio] = [Requirement(d) for d in dependencies if Requirement(d).name == "temporalio"]
    return temporalio


def test_the_pin_is_one_minor_wide_and_the_installed_sdk_is_in_it() -> None:
    requirement = _requirement()
    installed = Version(importlib.metadata.version("temporalio"))
    assert requirement.specifier.contains(installed), f"temporalio {installed} is outside the pin {requirement}"
    next_minor = Version(f"{installed.major}.{installed.minor + 1}")
    assert not requirement.specifier.contains(next_minor), f"{requirement} admits {next_minor}: pin one minor"
    assert not requirement.specifier.contains(Version(f"{installed.major}.{installed.minor - 1}.99"))


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            value: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            value = getattr(value, name)
        return value
    raise ImportError(dotted)


@pytest.mark.parametrize("name", sandbox_fast.SDK_INTERNALS)
def test_every_private_sdk_name_the_fast_runner_uses_exists(name: str) -> None:
    assert _resolve(name) is not None


def test_the_sdk_instance_still_sets_what_the_fast_runner_reads() -> None:
    source = inspect.getsource(sdk_runner._Instance.__init__)
    for attribute in sandbox_fast.SDK_INSTANCE_ATTRIBUTES:
        assert re.search(rf"self\.{attribute}\s*(:[^=\n]*)?=", source), attribute
    # The in-sandbox object the direct lookups read, under the name the SDK's entry code gives it.
    assert f"{sandbox_fast.IN_SANDBOX} = " in inspect.getsource(sdk_runner._Instance)


def test_the_sdk_method_the_fast_runner_repeats_is_the_one_it_was_written_against() -> None:
    assert sandbox_fast.check() is None, (
        "temporalio changed _Instance._run_code: bring gymflow/workers/sandbox_fast.py's copy in line, then the hash"
    )
