"""The env packages the interop tests run, each installed by `gymflow envs install` in a venv of its own.

    .venv/bin/python tests/env_packages.py          # installs the missing or changed ones (.ci/run does)

They live under `.env-packages/` (the tests point GYMFLOW_ENV_PACKAGES_DIR there): two plain packages
pinning conflicting versions of six, benchmax 0.1.1.dev7 (its own MathEnv and a BaseEnv of the
tests'), verifiers 0.4.0 tasksets (single-turn, tool, multi-turn) and an OpenEnv env. Installing
needs the package index; the tests run offline once they are installed, and skip, naming this
script, when a package is absent. A package whose sources changed is installed again.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES_ROOT = ROOT / ".env-packages"
SOURCES = ROOT / "tests" / "envs" / "packages" / "sources"
POLICIES = ROOT / "tests" / "envs" / "packages" / "policies.py"
SCRIPT = "python tests/env_packages.py"
LEFTOVERS = {"__pycache__", "build", "dist"}
"""Build leftovers an older install may have left in a source directory: not part of the sources."""


@dataclass(frozen=True)
class TestPackage:
    """One env package of the tests and how it is installed."""

    distribution: str
    source: str
    """Directory under tests/envs/packages/sources."""
    envs: tuple[str, ...]
    datasets: dict[str, str] = field(default_factory=dict)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    policies: dict[str, str] = field(default_factory=dict)
    stateless: bool | tuple[str, ...] = False


def _policy(name: str) -> str:
    return f"{POLICIES}:{name}"


PACKAGES = {
    "pinned-a": TestPackage(
        "gymflow-example-pinned-a", "pinned_a", ("pinned-a",), {"": "sums"}, {"n": 4},
        {"reference": _policy("SumsPolicy")}, stateless=True,
    ),
    "pinned-b": TestPackage(
        "gymflow-example-pinned-b", "pinned_b", ("pinned-b",), {"": "sums"}, {"n": 4},
        {"reference": _policy("SumsPolicy")}, stateless=True,
    ),
    "bmx": TestPackage(
        "gymflow-example-bmx-envs", "bmx_envs", ("bmx-math", "bmx-notes"),
        {"": "json"},
        {
            "bmx-math:data_files": str(SOURCES / "bmx_envs" / "bmx_envs" / "math.jsonl"),
            "bmx-notes:data_files": str(SOURCES / "bmx_envs" / "bmx_envs" / "notes.jsonl"),
            "split": "train",
        },
        {"bmx-math:reference": _policy("CalculatorPolicy"), "bmx-notes:reference": _policy("NotesPolicy")},
        stateless=("bmx-math",),  # a calculator: a rollout that lost its node goes on elsewhere
    ),
    "vf": TestPackage(
        "gymflow-example-vf-envs", "vf_envs", ("vf-arith", "vf-calc", "vf-guess"),
        policies={
            "vf-arith:reference": _policy("ArithPolicy"),
            "vf-calc:reference": _policy("ArithPolicy"),
            "vf-guess:reference": _policy("BisectPolicy"),
        },
    ),
    "oe": TestPackage(
        "gymflow-example-oe-envs", "oe_envs", ("oe-guess",), dataset_options={"n": 4},
        policies={"reference": _policy("BisectPolicy")},
    ),
}  # fmt: skip


def source_digest(package: TestPackage) -> str:
    """What the install is of: how it is installed, the package's sources and the policies file it names."""
    files = sorted(
        p
        for p in (SOURCES / package.source).rglob("*")
        if p.is_file() and not any(part in LEFTOVERS or part.endswith(".egg-info") for part in p.parts)
    )
    data = repr(package).encode() + b"".join(
        str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() for p in [*files, POLICIES]
    )
    return hashlib.sha256(data).hexdigest()


def _marker(key: str) -> Path:
    return PACKAGES_ROOT / f".{key}.source"


def installed(key: str) -> bool:
    """Whether package `key` is installed from its current sources."""
    marker = _marker(key)
    return marker.is_file() and marker.read_text() == source_digest(PACKAGES[key])


def install(key: str) -> None:
    """Install package `key` with `gymflow envs install` (unless installed from these sources)."""
    if installed(key):
        return
    os.environ["GYMFLOW_ENV_PACKAGES_DIR"] = str(PACKAGES_ROOT)
    from gymflow.envs.packages import install as installer
    from gymflow.envs.packages import store

    package = PACKAGES[key]
    for old in store.find_package(package.distribution):
        store.remove(old.name, old.version)
    record = installer.install(
        str(SOURCES / package.source),
        datasets=package.datasets,
        dataset_options=package.dataset_options,
        policies=package.policies,
        stateless=package.stateless,
        say=lambda line: print(f"  {line}", file=sys.stderr),
    )
    _marker(key).write_text(source_digest(package))
    print(f"{key}: {record.name} {record.version} ({', '.join(d.name for d in record.envs)})")


if __name__ == "__main__":
    PACKAGES_ROOT.mkdir(exist_ok=True)
    for name in sys.argv[1:] or PACKAGES:
        install(name)
