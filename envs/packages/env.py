"""An env of an env package as a gymflow env: `McpEnv` whose one server is the bridge.

Each rollout gets its own bridge process from the warm pool (`McpEnv`), started with the package
venv's python in the rollout's workspace: the env's code, its tools and its reward run there, in the
package's pins, never in the worker. Before a rollout is known the bridge has already built the env,
so a pooled init is one control call (`gymflow.init`); release asks the env to release, then the
bridge (which kills every process the env started) and its process group go.

Control results map onto the contract's failure types: an init the env refuses for its arguments is a
`TypeError` (a config error), an env machinery failure an `InfraError` (recovered or infra-failed),
a reward function that raises a `ValueError` (REWARD_ERROR). Classes are made per installed env
(`package_env_class`), so `package` and the trajectories name the exact install that ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from gymflow.envs.contract import (
    EnvPackageRef,
    Message,
    Reward,
    Task,
    ToolResult,
    ToolSpec,
    Unavailable,
)
from gymflow.envs.errors import DatasetError, InfraError, PackageError, ToolError
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.packages import launch, store
from gymflow.envs.packages.bridge.__main__ import CONTROL
from gymflow.envs.packages.bridge.base import SYSTEM_PROMPT_KEY
from gymflow.envs.packages.store import EnvDecl, PackageRecord

SERVER = "env"
"""The bridge's server name in the env's `mcp_servers`."""
GENERATED = "generated"
"""The dataset name `gymflow eval` runs without `--dataset`: a package env's declared default."""
KIND_DATASETS = {"openenv": "seeds", "verifiers": "taskset"}
"""Default datasets of kinds that always have one (OpenEnv episodes by seed, the verifiers taskset)."""
CONTROL_TIMEOUTS_S = {"init": 300.0, "reward": 600.0, "respond": 300.0, "copy_in": 120.0, "copy_out": 120.0}
RELEASE_TIMEOUT_S = 15.0
BRIDGE_START_S = 180.0
"""A bridge's start and handshake: importing a framework and building the env (benchmax starts its
MCP servers when built) takes seconds, more on a loaded node."""


class ControlError(Exception):
    """A control call the bridge answered with an error: `kind` is args, fault or env."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class PackageEnv(McpEnv):
    """An env of an installed env package (see the module docstring)."""

    record: ClassVar[PackageRecord]
    decl: ClassVar[EnvDecl]
    origin: ClassVar[str]
    """What the env is in its package (`module:Class`), for listings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._placeholders: dict[str, dict[str, str]] = {}

    # -- class facts --------------------------------------------------------------------------
    @classmethod
    def unavailable(cls, **env_kwargs: Any) -> Unavailable | None:
        del env_kwargs
        if not cls.record.python_path.exists():
            return Unavailable(
                f"env package {cls.record.name} {cls.record.version} has no venv here ({cls.record.venv})",
                cls.record.install_command(),
            )
        return None

    @classmethod
    def recorded_tools(cls) -> list[ToolSpec]:
        """The tools the install listed (gymflow.envs.catalog shows these without starting anything)."""
        return list(cls.decl.tools)

    # -- lifecycle ----------------------------------------------------------------------------
    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        files = rollout_args.pop("files", None)
        await super().init_rollout(rollout_id, **({"files": files} if files else {}))
        try:
            answer = await self._control(rollout_id, "init", {"rollout_id": rollout_id, "args": rollout_args})
        except ControlError as exc:
            await self.release_rollout(rollout_id)
            if exc.kind == "args":
                raise TypeError(str(exc)) from exc
            raise InfraError(f"{self.name}: init failed: {exc}") from exc
        self._placeholders[rollout_id] = {str(k): str(v) for k, v in (answer.get("placeholders") or {}).items()}

    async def release_rollout(self, rollout_id: str) -> None:
        self._placeholders.pop(rollout_id, None)
        sset = self._rollouts.get(rollout_id)
        if sset is not None and sset.alive:  # the env releases first; the bridge then kills what is left
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._control(rollout_id, "release", {}), RELEASE_TIMEOUT_S)
        await super().release_rollout(rollout_id)

    def placeholders(self, rollout_id: str) -> dict[str, str]:
        return {**super().placeholders(rollout_id), **self._placeholders.get(rollout_id, {})}

    async def get_system_prompt(self, task: Task | None = None) -> str:
        own = task.metadata.get(SYSTEM_PROMPT_KEY) if task is not None else None
        return str(own) if own else self.decl.system_prompt

    # -- tools --------------------------------------------------------------------------------
    async def list_tools(self) -> list[ToolSpec]:
        return [tool for tool in await super().list_tools() if not tool.name.startswith(CONTROL)]

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        if tool_name.startswith(CONTROL):
            known = ", ".join(t.name for t in await self.list_tools()) or "none"
            raise ToolError(f"unknown tool {tool_name!r}; available tools: {known}")
        return await super().run_tool(rollout_id, tool_name, **tool_args)

    # -- reward and env turns -----------------------------------------------------------------
    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        args = {
            "messages": [m.model_dump(mode="json") for m in completion],
            "ground_truth": ground_truth,
            "extra": {k: v for k, v in kwargs.items() if k in {"task_id", "metadata"}},
        }
        try:
            answer = await self._control(rollout_id, "reward", args)
        except ControlError as exc:
            if exc.kind == "env":  # the env's reward code raised
                raise ValueError(f"{self.name}: {exc}") from exc
            raise InfraError(f"{self.name}: reward failed: {exc}") from exc
        components = {str(k): float(v) for k, v in (answer.get("components") or {}).items()}
        return Reward(total=math.fsum(components.values()), components=components, info=answer.get("info") or {})

    async def env_response(self, rollout_id: str, messages: list[Message]) -> list[Message] | None:
        try:
            answer = await self._control(
                rollout_id, "respond", {"messages": [m.model_dump(mode="json") for m in messages]}
            )
        except ControlError as exc:
            raise InfraError(f"{self.name}: {exc}") from exc
        said = answer.get("messages")
        return None if said is None else [Message(role="user", content=str(m.get("content") or "")) for m in said]

    # -- workspace ----------------------------------------------------------------------------
    async def copy_to_workspace(self, rollout_id: str, src_path: Path, dst_filename: str | None = None) -> None:
        """Into the env's own workspace when it has one (benchmax's), else the rollout's."""
        staged = self._staging(rollout_id) / f"{uuid.uuid4().hex[:8]}-{Path(src_path).name}"
        staged.parent.mkdir(exist_ok=True)
        shutil.copyfile(src_path, staged)
        try:
            answer = await self._control(
                rollout_id, "copy_in", {"source": str(staged), "name": dst_filename or Path(src_path).name}
            )
        finally:
            staged.unlink(missing_ok=True)
        if not answer.get("supported"):
            await super().copy_to_workspace(rollout_id, src_path, dst_filename)

    async def copy_content_to_workspace(self, rollout_id: str, src_content: str | bytes, dst_filename: str) -> None:
        staged = self._staging(rollout_id) / f"{uuid.uuid4().hex[:8]}-{Path(dst_filename).name}"
        staged.parent.mkdir(exist_ok=True)
        staged.write_bytes(src_content.encode() if isinstance(src_content, str) else src_content)
        try:
            await self.copy_to_workspace(rollout_id, staged, dst_filename)
        finally:
            staged.unlink(missing_ok=True)

    async def copy_from_workspace(self, rollout_id: str, src_filename: str, dst_path: Path) -> None:
        staged = self._staging(rollout_id) / f"{uuid.uuid4().hex[:8]}.out"
        staged.parent.mkdir(exist_ok=True)
        answer = await self._control(rollout_id, "copy_out", {"name": src_filename, "destination": str(staged)})
        if not answer.get("supported"):
            await super().copy_from_workspace(rollout_id, src_filename, dst_path)
            return
        shutil.move(staged, dst_path)

    def _staging(self, rollout_id: str) -> Path:
        return self.workspace(rollout_id) / ".gymflow-copy"

    async def _control(self, rollout_id: str, verb: str, args: Mapping[str, Any]) -> dict[str, Any]:
        session = self._get(rollout_id).sessions[SERVER]
        result = await session.call(CONTROL + verb, dict(args))
        try:
            answer = dict(json.loads(result.text))
        except ValueError as exc:
            raise InfraError(f"{self.name}: the bridge answered {CONTROL}{verb} with {result.text[:200]!r}") from exc
        if result.is_error:
            raise ControlError(str(answer.get("kind", "fault")), str(answer.get("error", result.text)))
        return answer

    # -- data ---------------------------------------------------------------------------------
    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """`generated` (what `gymflow eval` runs without `--dataset`): the dataset named at install
        (`--dataset`), or the kind's own (a verifiers taskset's tasks, OpenEnv episodes by seed).
        A `.jsonl` file of gymflow Tasks is read as it is; any other name goes to the env's own loader
        (benchmax: `load_dataset(name, **options)`, e.g. `json` with `data_files`), in the package's
        venv, once (then from its cache). `n` takes the first n tasks; `seed` is ignored (an env's
        own dataset keeps its own order)."""
        options = dict(kwargs)
        limit = options.pop("n", None)
        options.pop("seed", None)  # gymflow's generators take one; an env's own dataset has its own order
        if name.endswith(".jsonl") and Path(name).is_file():  # gymflow Tasks already (a generated dataset)
            return _limited(_read_tasks(Path(name)), limit)
        if name == GENERATED:
            default = cls.decl.dataset or KIND_DATASETS.get(cls.decl.kind)
            if default is None:
                raise DatasetError(
                    f"{cls.name} has no default dataset: name one (--dataset NAME, its loader's options with "
                    "--dataset-option), or install it with --dataset"
                )
            name, options = default, {**cls.decl.dataset_options, **options}
        return _limited(_read_tasks(dataset_file(cls.record, cls.decl, name, options)), limit)


def _read_tasks(path: Path) -> list[Task]:
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(Task.model_validate_json(line))
            except ValueError as exc:
                raise DatasetError(f"{path}:{number}: {exc}") from exc
    return tasks


def _limited(tasks: list[Task], limit: Any) -> list[Task]:
    """The first `limit` tasks (gymflow's `n`), or all of them."""
    return tasks if limit is None else tasks[: int(limit)]


def dataset_file(record: PackageRecord, decl: EnvDecl, name: str, options: Mapping[str, Any]) -> Path:
    """The JSONL cache of `decl`'s dataset `name` with `options`, loaded by the bridge if missing.

    Raises:
        DatasetError: The env's loader failed (the message ends with its stderr).
    """
    key = hashlib.sha256(
        json.dumps([decl.name, name, dict(options)], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    path = record.directory / "datasets" / f"{key}.jsonl"
    if not path.is_file():
        path.parent.mkdir(exist_ok=True)
        try:
            launch.run_one_shot(
                record,
                decl,
                "dataset",
                "--name",
                name,
                "--options",
                json.dumps(dict(options), default=str),
                "--out",
                str(path),
            )
        except PackageError as exc:
            raise DatasetError(str(exc)) from exc
    return path


_classes: dict[tuple[str, str], type[PackageEnv]] = {}


def package_env_class(record: PackageRecord, decl: EnvDecl, *, name: str | None = None) -> type[PackageEnv]:
    """The gymflow env class of `decl` in `record` (one class per install and env, cached)."""
    key = (record.id, decl.name)
    cls = _classes.get(key)
    if cls is None:
        server = {
            "command": str(record.python_path),
            "args": launch.bridge_args("serve"),
            "env": launch.bridge_env(record, decl),
            "preload": launch.bridge_preload(decl),
            "startup_timeout_s": BRIDGE_START_S,
            "tool_timeouts": {CONTROL + verb: timeout for verb, timeout in CONTROL_TIMEOUTS_S.items()},
        }
        attributes: dict[str, Any] = {
            "__doc__": decl.doc or decl.description or f"{decl.name}: an env of {record.name} {record.version}",
            "__module__": __name__,
            "name": name or decl.name,
            "record": record,
            "decl": decl,
            "origin": decl.target,
            "mcp_servers": {SERVER: server},
            "system_prompt": decl.system_prompt,
            "stateless": decl.stateless,
            "replayable": decl.replayable,
            "env_turns": decl.env_turns,
            "policies": dict(decl.policies),
            "package": EnvPackageRef(
                name=record.name, version=record.version, digest=record.digest, env=decl.name, kind=decl.kind
            ),
        }
        cls = type(f"Package_{decl.name}", (PackageEnv,), attributes)
        _classes[key] = cls
    return cls


def installed_env_class(name: str) -> type[PackageEnv] | None:
    """The class of installed env `name` (`NAME` or `NAME@VERSION`), or None if no package declares it."""
    found = store.find_env(name)
    return None if found is None else package_env_class(*found, name=name)


def installed_env_names() -> list[str]:
    """Installed envs as listings name them: `NAME`, or `NAME@VERSION` for each of several versions."""
    versions: dict[str, list[str]] = {}
    for record in store.records():
        for decl in record.envs:
            versions.setdefault(decl.name, []).append(record.version)
    return sorted(
        name if len(set(found)) == 1 else f"{name}@{version}"
        for name, found in versions.items()
        for version in sorted(set(found))
    )
