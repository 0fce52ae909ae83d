"""Environment names -> classes: the built-ins plus third-party envs from entry points.

A third-party package registers an env with

    [project.entry-points."gymflow.envs"]
    myenv = "my_package.env:MyEnv"

A name ending in .yaml/.yml/.json is an env file (gymflow.envs.envfile): the env is identified by
that path, so the CLI and every worker resolve the same name to the same class. Classes are
imported lazily, so a worker only pays for the envs it runs.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from gymflow.envs.contract import BaseEnv, Task
from gymflow.envs.errors import UnknownEnvError

ENTRY_POINT_GROUP = "gymflow.envs"

BUILTIN: dict[str, str] = {
    "math": "gymflow.envs.builtin.math.env:MathEnv",
    "sheets": "gymflow.envs.builtin.sheets.env:SheetsEnv",
    "search": "gymflow.envs.builtin.search.env:SearchEnv",
    "units": "gymflow.envs.examples.units:UnitsEnv",
    "crm": "gymflow.envs.builtin.crm.env:CrmEnv",
    "crm-support": "gymflow.envs.builtin.crm_support.env:CrmSupportEnv",
    "crm-support-llm": "gymflow.envs.builtin.crm_support.env:CrmSupportLlmEnv",
    "harbor": "gymflow.envs.builtin.harbor.env:HarborEnv",
    "workspace-judge": "gymflow.envs.builtin.workspace_judge.env:WorkspaceJudgeEnv",
}


_registered: dict[str, type[BaseEnv]] = {}
ENV_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def is_env_file(name: str) -> bool:
    """Whether `name` names an env file rather than a registered env."""
    return name.lower().endswith(ENV_FILE_SUFFIXES)


def storage_name(name: str) -> str:
    """A directory name for env `name`'s files on a worker (env-file paths contain slashes)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) and not is_env_file(name):
        return name
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(name).stem)[:40]
    return f"file-{stem}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def register(name: str, cls: type[BaseEnv]) -> None:
    """Register an env class under `name` in this process (e.g. in your own worker script)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseEnv)):
        raise TypeError(f"{cls!r} is not a BaseEnv subclass")
    _registered[name] = cls


def _targets() -> dict[str, str]:
    targets = {name: f"{cls.__module__}:{cls.__qualname__}" for name, cls in _registered.items()}
    targets.update(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        targets.setdefault(ep.name, ep.value)
    return targets


def available() -> list[str]:
    """Names of every env that can be loaded (installed env packages' included, gymflow.envs.packages)."""
    from gymflow.envs.packages.env import installed_env_names

    return sorted({*_targets(), *installed_env_names()})


def env_class(name: str) -> type[BaseEnv]:
    """The env class registered as `name`, or built from the env file `name`.

    Raises:
        UnknownEnvError: Nothing is registered under `name`.
        EnvFileError: `name` is an env file that is missing or invalid.
    """
    if name in _registered:
        return _registered[name]
    if is_env_file(name):
        from gymflow.envs.envfile import env_class_from_file

        return env_class_from_file(Path(name))
    target = _targets().get(name)
    if target is None:
        from gymflow.envs.packages.env import installed_env_class  # env packages, in venvs of their own

        packaged = installed_env_class(name)
        if packaged is not None:
            return packaged
        raise UnknownEnvError(f"unknown env {name!r}; available: {', '.join(available())}")
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, BaseEnv)):
        raise TypeError(f"{target} is not a BaseEnv subclass")
    return cls


def dataset_page(cls: type[BaseEnv], dataset: str, options: dict[str, Any], offset: int, limit: int) -> list[Task]:
    """Tasks `offset`..`offset + limit - 1` of `cls.load_dataset(dataset, **options)`.

    Module-level and light to import, so a worker can run it in its process pool (gymflow.envs.runtime.admission).
    """
    return page_of(cls.load_dataset(dataset, **options), offset, limit)


def page_of(tasks: Iterable[Task], offset: int, limit: int) -> list[Task]:
    """One page of a task list or iterable (an iterable is read no further than the page)."""
    if isinstance(tasks, list | tuple):
        return list(tasks[offset : offset + limit])
    out: list[Task] = []
    for index, task in enumerate(tasks):
        if index >= offset + limit:
            break
        if index >= offset:
            out.append(task)
    return out
