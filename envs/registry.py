"""Environment names -> classes: the built-ins plus third-party envs from entry points.

A third-party package registers an env with

    [project.entry-points."gymflow.envs"]
    myenv = "my_package.env:MyEnv"

Classes are imported lazily, so a worker only pays for the envs it runs.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from envs.contract import BaseEnv

ENTRY_POINT_GROUP = "gymflow.envs"

BUILTIN: dict[str, str] = {
    "math": "envs.math.env:MathEnv",
    "units": "envs.examples.units:UnitsEnv",
}


class UnknownEnvError(KeyError):
    """No env is registered under that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown env"


_registered: dict[str, type[BaseEnv]] = {}


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
    """Names of every env that can be loaded."""
    return sorted(_targets())


def env_class(name: str) -> type[BaseEnv]:
    """The env class registered as `name`."""
    if name in _registered:
        return _registered[name]
    target = _targets().get(name)
    if target is None:
        raise UnknownEnvError(f"unknown env {name!r}; available: {', '.join(available())}")
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, BaseEnv)):
        raise TypeError(f"{target} is not a BaseEnv subclass")
    return cls
