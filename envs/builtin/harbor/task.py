"""Harbor task directories, loaded and checked.

A task is a directory (Harbor's format, the successor of terminal-bench's):

    task.toml          [agent] timeout_sec, [verifier] timeout_sec + env, [environment]
                       build_timeout_sec / cpus / memory_mb / storage_mb / allow_internet, [metadata]
    instruction.md     the prompt
    environment/       the image's build context, with its Dockerfile (and optionally docker-compose.yaml:
                       the task's other services, e.g. a database, beside the main one)
    tests/test.sh      the verifier: copied to /tests after the agent is done; writes
                       /logs/verifier/reward.txt (a number) or reward.json ({"reward": x, ...})
    solution/solve.sh  the oracle (optional)

A directory of task directories is a dataset; one task is one row. Bad files fail loudly with the
file and the field (`TaskError`); unknown keys are kept out of the way (Harbor has many optional
ones gymflow does not use: MCP servers, GPUs, a prebuilt `docker_image`, ...) except those that
change what a task means and that gymflow cannot honour, which are refused.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gymflow.envs.errors import TaskError
from gymflow.envs.runtime import compose
from gymflow.envs.runtime.base import Limits
from gymflow.envs.runtime.compose import ComposeProject

TASK_FILE = "task.toml"
INSTRUCTION_FILE = "instruction.md"
ENVIRONMENT_DIR = "environment"
TESTS_DIR = "tests"
TEST_SCRIPT = "test.sh"
SOLUTION_DIR = "solution"
SOLUTION_SCRIPT = "solve.sh"


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AgentSection(_Section):
    timeout_sec: float = Field(default=600.0, gt=0)
    """How long the agent may work before it is stopped and the verifier runs."""


class VerifierSection(_Section):
    timeout_sec: float = Field(default=600.0, gt=0)
    """How long tests/test.sh may run; past it the rollout is infra-failed, never scored 0."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the verifier."""


class SolutionSection(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class EnvironmentSection(_Section):
    build_timeout_sec: float = Field(default=600.0, gt=0)
    cpus: float = Field(default=1.0, gt=0)
    memory_mb: int = Field(default=2048, ge=16)
    storage_mb: int = Field(default=10240, ge=16)
    storage_hard: bool = False
    """gymflow's: writes must fail at storage_mb; a node that can only watch the disk (docker on ext4)
    refuses the task before starting it (gymflow.envs.runtime.diskwatch)."""
    allow_internet: bool = False
    """Harbor's default is true; gymflow runs task containers without a network unless a task asks."""
    gpus: int = Field(default=0, ge=0)
    docker_image: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _sizes(cls, data: Any) -> Any:
        """Harbor's older spellings: `memory = "2G"` / `storage = "10G"`."""
        if isinstance(data, dict):
            for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if old in data and new not in data:
                    data = {**data, new: _megabytes(data[old], old)}
        return data

    @model_validator(mode="after")
    def _supported(self) -> EnvironmentSection:
        if self.gpus:
            raise ValueError("gpus: GPU tasks are not supported by gymflow's container runtime")
        if self.docker_image:
            raise ValueError("docker_image: prebuilt images are not supported yet; give environment/Dockerfile")
        return self


class TaskConfig(_Section):
    """task.toml."""

    version: str = "1.0"
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: AgentSection = Field(default_factory=AgentSection)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)


class HarborTask(BaseModel):
    """One loaded task."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: Path
    config: TaskConfig
    instruction: str
    services: ComposeProject | None = None
    """environment/docker-compose.yaml, when the task has one: `main` is the agent's container."""

    @property
    def environment_dir(self) -> Path:
        return self.path / ENVIRONMENT_DIR

    @property
    def dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    @property
    def tests_dir(self) -> Path:
        return self.path / TESTS_DIR

    @property
    def solution_dir(self) -> Path | None:
        solution = self.path / SOLUTION_DIR
        return solution if (solution / SOLUTION_SCRIPT).is_file() else None

    def limits(self, *, pids: int = 512) -> Limits:
        """The container limits task.toml asks for."""
        env = self.config.environment
        return Limits(
            cpus=env.cpus,
            memory_mb=env.memory_mb,
            storage_mb=env.storage_mb,
            storage_hard=env.storage_hard,
            pids=pids,
            network=env.allow_internet,
        )


COMPOSE_NAMES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def load_task(path: Path) -> HarborTask:
    """Load and check one task directory.

    Raises:
        TaskError: A required file is missing, task.toml is not valid TOML, or a field is invalid.
    """
    if not path.is_dir():
        raise TaskError(f"{path}: not a task directory")
    toml_path = path / TASK_FILE
    try:
        raw = tomllib.loads(toml_path.read_text())
    except FileNotFoundError:
        raise TaskError(f"{toml_path}: missing (every task needs a task.toml)") from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{toml_path}: not valid TOML: {exc}") from None
    try:
        config = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise TaskError(f"{toml_path}: {problems}") from None
    for required in (INSTRUCTION_FILE, f"{ENVIRONMENT_DIR}/Dockerfile", f"{TESTS_DIR}/{TEST_SCRIPT}"):
        if not (path / required).is_file():
            raise TaskError(f"{path}: missing {required}")
    instruction = (path / INSTRUCTION_FILE).read_text().strip()
    if not instruction:
        raise TaskError(f"{path / INSTRUCTION_FILE}: empty instruction")
    services = _services(path.resolve() / ENVIRONMENT_DIR, config.environment)
    return HarborTask(name=path.name, path=path.resolve(), config=config, instruction=instruction, services=services)


def _services(environment: Path, section: EnvironmentSection) -> ComposeProject | None:
    """The task's compose file, parsed (None without one). Raises ComposeError (a TaskError) naming the fault."""
    found = [environment / name for name in COMPOSE_NAMES if (environment / name).is_file()]
    if not found:
        return None
    if section.allow_internet:
        raise TaskError(f"{found[0]}: allow_internet with a compose file: a task's services run on a network of the "
                        "rollout's own, without a route out")  # fmt: skip
    variables = {  # what Harbor's own compose base defines, for files that refer to it
        "CONTEXT_DIR": str(environment),
        "CPUS": f"{section.cpus:g}",
        "MEMORY": f"{section.memory_mb}M",
        "ENV_AGENT_LOGS_PATH": "/logs/agent",
        "ENV_VERIFIER_LOGS_PATH": "/logs/verifier",
    }
    return compose.load(found[0], variables=variables)


def load_dataset(root: Path) -> list[HarborTask]:
    """Every task directory under `root` (one level deep), sorted by name; `root` may be one task.

    Raises:
        TaskError: `root` holds no task, or one of them is invalid (the first error found).
    """
    if (root / TASK_FILE).is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise TaskError(f"{root}: not a directory of Harbor tasks")
    tasks = [load_task(child) for child in sorted(root.iterdir()) if (child / TASK_FILE).is_file()]
    if not tasks:
        raise TaskError(f"{root}: no task directories (a task directory holds a task.toml)")
    return tasks


def _megabytes(value: Any, field: str) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip().upper().removesuffix("B")
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(float(text) / (1024 * 1024))  # plain bytes
    except ValueError:
        raise ValueError(f"{field}: {value!r} is not a size like '2G' or '512M'") from None
