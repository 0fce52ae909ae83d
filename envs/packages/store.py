"""Installed env packages on disk, and how env names find them.

Layout under the root (`GYMFLOW_ENV_PACKAGES_DIR`, else `<GYMFLOW_DATA_DIR or .gymflow>/env-packages`,
the variables the `Settings` of every gymflow process read, so a CLI, a worker and a policy server
started by a worker agree):

    <root>/<install id>/venv/            the package's own venv
    <root>/<install id>/package.json     its record, written last: an install without one never finished
    <root>/<install id>/dist/            the package's wheel (installed from a directory, a wheel or git)
    <root>/<install id>/datasets/        datasets the bridge loaded, as Task JSONL (a cache)
    <root>/.bridge/<digest>/gymflow_bridge/   the bridge's code, as the running gymflow ships it

Env names: an env package declares named envs; `NAME` is the newest installed version's env NAME,
`NAME@VERSION` that version's. Several versions of one package live side by side (a venv each).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gymflow.envs.contract import EnvPackageRef, ToolSpec
from gymflow.envs.errors import PackageError

RECORD = "package.json"
ROOT_VARIABLE = "GYMFLOW_ENV_PACKAGES_DIR"
Kind = Literal["plain", "benchmax", "verifiers", "openenv"]
Source = Literal["pypi", "directory", "wheel", "git"]


class EnvDecl(BaseModel):
    """One env an env package declares, as the install found it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """The env's gymflow name (the entry point's name, or `--env NAME=...`)."""
    target: str
    """`module:attribute` (a bare module for a verifiers taskset package)."""
    kind: Kind
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the env (benchmax: the class; verifiers: `taskset`, `role`)."""
    description: str = ""
    doc: str = ""
    system_prompt: str = ""
    tools: list[ToolSpec] = Field(default_factory=list)
    dataset: str | None = None
    """The dataset `gymflow eval NAME` runs without `--dataset` (None: the env's own default)."""
    dataset_options: dict[str, Any] = Field(default_factory=dict)
    tasks: int | None = None
    """Tasks in that dataset, counted at install."""
    policies: dict[str, str] = Field(default_factory=dict)
    """Scripted baseline policies (gymflow-side `module:Class` or `file.py:Class`), name -> spec."""
    stateless: bool = False
    replayable: bool = False
    env_turns: bool = False


class PackageRecord(BaseModel):
    """One installed env package (`package.json`)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    version: str
    digest: str
    """sha256 of the distribution's installed files (gymflow.envs.packages.digest)."""
    spec: str
    """What was installed, as given (`benchmax==0.1.1.dev7`, a directory, a wheel, a git URL)."""
    source: Source
    requirement: str
    """How to install exactly this again: `name==version`, or the wheel in `dist/`."""
    extras: list[str] = Field(default_factory=list)
    """Further requirements installed beside it (`--with`)."""
    commit: str | None = None
    """The git commit, for a git URL."""
    python: str
    installed_at: str
    lock: list[str] = Field(default_factory=list)
    """`pip freeze` of the venv: every distribution and its version."""
    framework_versions: dict[str, str] = Field(default_factory=dict)
    envs: list[EnvDecl]

    @property
    def directory(self) -> Path:
        return root() / self.id

    @property
    def venv(self) -> Path:
        return self.directory / "venv"

    @property
    def python_path(self) -> Path:
        return self.venv / "bin" / "python"

    def ref(self, env: str = "", kind: str = "") -> EnvPackageRef:
        return EnvPackageRef(name=self.name, version=self.version, digest=self.digest, env=env, kind=kind)

    def install_command(self) -> str:
        return install_command(self.name, self.version, spec=self.spec, source=self.source)


def root() -> Path:
    """Where env packages live (see the module docstring)."""
    configured = os.environ.get(ROOT_VARIABLE)
    if configured:
        return Path(configured).expanduser().resolve()
    return (Path(os.environ.get("GYMFLOW_DATA_DIR") or ".gymflow") / "env-packages").resolve()


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def records(base: Path | None = None) -> list[PackageRecord]:
    """Every finished install under the root, oldest first."""
    base = base or root()
    found = []
    for path in sorted(base.glob(f"*/{RECORD}")):
        try:
            found.append(PackageRecord.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue  # half-written or foreign: not an install
    return sorted(found, key=lambda r: r.installed_at)


def write(record: PackageRecord) -> None:
    """Commit an install: its record, written atomically."""
    path = record.directory / RECORD
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.model_dump_json(indent=1))
    tmp.replace(path)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def env_names() -> list[str]:
    """Every env the installed packages declare: `NAME` (newest version) and `NAME@VERSION`."""
    names: set[str] = set()
    for record in records():
        for decl in record.envs:
            names |= {decl.name, f"{decl.name}@{record.version}"}
    return sorted(names)


def find_env(name: str) -> tuple[PackageRecord, EnvDecl] | None:
    """The install and declaration env `name` (`NAME` or `NAME@VERSION`) means, or None."""
    base, _, version = name.partition("@")
    matches = [
        (record, decl)
        for record in records()
        for decl in record.envs
        if decl.name == base and (not version or record.version == version)
    ]
    return matches[-1] if matches else None  # the newest install


def find_package(name: str, version: str | None = None) -> list[PackageRecord]:
    """Installs of distribution `name` (of `version`, if given), oldest first."""
    return [r for r in records() if normalise(r.name) == normalise(name) and version in (None, r.version)]


def install_command(name: str, version: str, *, spec: str | None = None, source: Source = "pypi") -> str:
    """The command that installs `name` at `version` (for errors; a directory or wheel is named as given)."""
    what = f"{name}=={version}" if source == "pypi" or spec is None else spec
    return f"gymflow envs install '{what}'"


def bundled_name(record: PackageRecord) -> str:
    """The directory a training bundle keeps an install in (gymflow.activities.bundle)."""
    return f"{normalise(record.name)}-{record.version}"


def check_pins(pins: dict[str, str]) -> list[str]:
    """`env_packages.NAME: ...` for each pinned package version not installed here (with the command
    that installs it); empty when every pin is installed."""
    problems = []
    for name, wanted in pins.items():
        version = wanted.removeprefix("==").strip()
        if find_package(name, version):
            continue
        installed = sorted({r.version for r in find_package(name)})
        have = f"installed: {', '.join(installed)}" if installed else "not installed"
        problems.append(
            f"env_packages.{name}: version {version} is not installed on this node ({have}); "
            f"install it with: {install_command(name, version)}"
        )
    return problems


def remove(name: str, version: str | None = None) -> list[PackageRecord]:
    """Delete the installs of package `name` (of `version`); returns what was removed.

    Raises:
        PackageError: Nothing of that name (and version) is installed.
    """
    found = find_package(name, version)
    if not found:
        what = f"{name} {version}" if version else name
        raise PackageError(f"no env package {what} is installed (see `gymflow envs list`)")
    for record in found:
        (record.directory / RECORD).unlink(missing_ok=True)  # uncommitted first: never half an install
        shutil.rmtree(record.directory, ignore_errors=True)
    return found


def read_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))
