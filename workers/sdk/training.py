"""Reading a training run's config (YAML) and naming every field at fault in one error.

A config is checked twice before anything starts: its shape (pydantic, `RunConfig`) and what the
shape cannot say (gymflow.activities.training_checks.check_config: the env and its baseline policies exist, the
trainer's command or SkyPilot task is there, the resources fit the local backend). Reporting
only the first failing stage would make a config with three mistakes take three tries, so when
the shape is wrong the faulty fields are set aside (left at their defaults) and the rest is
checked too; the error lists every problem of both stages. A config whose required fields are
themselves at fault cannot be checked further and reports its shape problems alone.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gymflow.activities.training_schema import RunConfig
from gymflow.envs.errors import ConfigError


def read_config_data(path: Path) -> dict[str, Any]:
    """The mapping in a run config file (YAML, or JSON).

    Raises:
        ConfigError: Missing file, not YAML, or not a mapping.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a run config is a mapping (env, dataset, trainer, ...)")
    return data


def shape_problems(exc: ValidationError) -> list[str]:
    """`field.path: message` for every problem pydantic found."""
    return [f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()]


def load_run_config(path: Path) -> RunConfig:
    """A run config from a YAML (or JSON) file, its shape checked (every bad field named).

    Raises:
        ConfigError: Missing file, not YAML, or invalid fields.
    """
    try:
        return RunConfig.model_validate(read_config_data(path))
    except ValidationError as exc:
        raise ConfigError(f"{path}: " + "; ".join(shape_problems(exc))) from None


def check_run_config(data: dict[str, Any], *, source: Path | str, require_skypilot: bool = True) -> RunConfig:
    """The run config in `data`, checked in shape and content.

    Raises:
        ConfigError: Every problem found, shape and content, in one message.
    """
    from gymflow.activities.training_checks import check_config  # the worker's own checks (imports the env registry)

    problems: list[str] = []
    config: RunConfig | None
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = shape_problems(exc)
        config = _without(data, [e["loc"] for e in exc.errors()])
    if config is not None:
        problems += [p for p in check_config(config, require_skypilot=require_skypilot) if p not in problems]
    if problems or config is None:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    return config


def _without(data: dict[str, Any], locations: Sequence[tuple[int | str, ...]]) -> RunConfig | None:
    """`data` with the values at `locations` removed (back to their defaults), if that is a valid config."""
    rest = copy.deepcopy(data)
    for location in locations:
        # The deepest part of the location that is in the data: a union's branch name (`cpus.int`)
        # is not, and a missing required field has nothing to remove.
        path: list[int | str] = []
        node: Any = rest
        for key in location:
            if not _has(node, key):
                break
            path.append(key)
            node = node[key]
        if path:
            parent: Any = rest
            for key in path[:-1]:
                parent = parent[key]
            del parent[path[-1]]
    try:
        return RunConfig.model_validate(rest)
    except ValidationError:
        return None


def _has(node: Any, key: int | str) -> bool:
    if isinstance(node, dict):
        return key in node
    return isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)
