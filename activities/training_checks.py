"""A training run config's static checks: what can be known wrong before anything starts.

Shared by the `validate_training_run` activity (gymflow.activities.training) and `gymflow train
launch` (gymflow.workers.sdk.training), which refuses a bad config naming every field at fault. The
env and its baseline policies must exist, the env packages it pins must be installed (each
problem names the install command), the trainer's workdir and program (local) or its SkyPilot
task (parsed by the real skypilot, resources included) must be usable, and a local run must fit
the machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from gymflow.activities import trainer_backends as backends
from gymflow.activities.training_schema import RunConfig
from gymflow.envs.contract import BaseEnv
from gymflow.envs.errors import EnvFileError, UnknownEnvError
from gymflow.envs.packages.store import check_pins, normalise
from gymflow.envs.registry import env_class


def check_config(config: RunConfig, *, require_skypilot: bool = True) -> list[str]:
    """Every static problem of `config` as `field: message` (empty when it is fine).

    Shared by the validate activity and `gymflow train launch`, which refuses a bad config before
    it starts anything. SkyPilot tasks are parsed by the real skypilot (`sky.Task`), resources
    included; without skypilot installed that is a problem unless `require_skypilot` is False
    (`--dryrun` only prints the task).
    """
    problems = check_pins(config.env_packages)  # each names the command that installs it
    cls: type[BaseEnv] | None = None
    try:
        cls = env_class(config.env)
    except (UnknownEnvError, EnvFileError) as exc:
        problems.append(f"env: {exc}")  # its policies cannot be checked; everything else still is
    if cls is not None and cls.package is not None:
        package = cls.package
        pinned = {normalise(k): v.removeprefix("==").strip() for k, v in config.env_packages.items()}.get(
            normalise(package.name)
        )
        if pinned is not None and pinned != package.version:
            problems.append(
                f"env: {config.env} runs {package.name} {package.version}, but env_packages pins {pinned}: "
                f"name the env {package.env}@{pinned}"
            )
    for field, ref in (("baseline", config.baseline), ("validation.smoke_policy", config.validation.smoke_policy)):
        if cls is not None and ref is not None and ref.policy is not None:
            try:
                cls.baseline_policy(ref.policy)
            except (ValueError, NotImplementedError) as exc:
                problems.append(f"{field}.policy: {exc}")
    trainer = config.trainer
    workdir = Path(trainer.workdir)
    if not workdir.is_dir():
        problems.append(f"trainer.workdir: no directory {workdir.resolve()}")
    if trainer.backend == "local":
        problems += _local_resources(config)
        program = trainer.command[0] if trainer.command else ""
        if not program or not (shutil.which(program) or (workdir / program).is_file() or program == "python"):
            problems.append(f"trainer.command: cannot find {program!r}")
    else:
        task_file = workdir / trainer.task_file
        if not task_file.is_file():
            problems.append(f"trainer.task_file: no file {task_file}")
        else:
            try:
                backends.validate_task(backends.task_config(task_file, env={}, resources=resources(config)))
            except RuntimeError as exc:
                if require_skypilot:
                    problems.append(f"trainer.backend: {exc}")
            except ValueError as exc:
                problems.append(f"trainer: {exc}")
    return problems


def resources(config: RunConfig) -> dict[str, Any]:
    """The trainer's resources as SkyPilot reads them (unset keys left out)."""
    return config.trainer.resources.model_dump(exclude_none=True)


def _local_resources(config: RunConfig) -> list[str]:
    resources = config.trainer.resources
    problems = []
    cpus = resources.minimum("cpus")
    if cpus is not None and cpus > (os.cpu_count() or 1):
        problems.append(
            f"trainer.resources.cpus: the local backend has {os.cpu_count()} CPUs, the run asks for {cpus:g}"
        )
    memory = resources.minimum("memory")
    total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    if memory is not None and memory > total_gb:
        problems.append(
            f"trainer.resources.memory: the local backend has {total_gb:.0f} GB, the run asks for {memory:g}"
        )
    if resources.accelerators:
        problems.append("trainer.resources.accelerators: the local backend has no accelerators (use backend: skypilot)")
    return problems
