"""An environment from one YAML/JSON file: MCP servers plus gymflow's keys, no Python class.

    # env.yaml — `gymflow rollout env.yaml`, `McpEnv.from_file("env.yaml")`
    mcpServers:                       # Claude Desktop / benchmax mcp_config.yaml format
      calculator: {command: mcp-server-calculator}
    system_prompt: Use the calculator. End with <answer>N</answer>.
    reward: reward_fn.py:reward       # or module:function, or a list of them (summed)
    # reward: {fn: math_equivalent, extract: answer_tag}   # or the reward library (library_reward)
    dataset: tasks.jsonl              # rows {"prompt"|"question", "answer"} or full Tasks
    stateless: true                   # recovery: a lost rollout just gets fresh servers
    replayable: false                 # recovery: re-running the tool calls rebuilds state
    fused_turns: true                 # one activity per turn: tool calls run with the model turn (stateless only)
    workspace:                        # every workspace, before its servers start
      files: {data.db: seed/data.db}  # workspace path: source (file or directory)
      setup: git init -q              # run in the workspace (sh -c), `{workspace}` filled in

`{workspace}` (the rollout's workspace directory) and `{rollout_id}` are filled in in the system
prompt and the tasks' prompts, as in server `args` and `env`. Every reward function is checked
against the call it will get when the file loads: one that cannot take it is an error naming the
signature it needs. Without `reward:` the final answer (the last `<answer>` of the last assistant
message, or that message whole) must equal the ground truth.

Relative paths (reward and parser files, seed files, the dataset) are relative to the env file. The env is
identified by its path: the workflow input names the file, and each worker loads the same path
(relative to its own working directory), so ship the file with the workers (the SkyPilot
workdir). Unknown keys and bad values are errors that name the key.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from envs.contract import Task, Wire
from envs.mcp.config import BUILTIN_PARSERS, parse_servers
from envs.mcp.env import McpEnv
from envs.mcp.library_reward import LibraryReward, LibraryRewardSpec
from envs.mcp.plugins import load_callable
from envs.mcp.reward import REWARD_KWARGS, REWARD_SIGNATURE, RewardFn, check_reward_fn
from envs.mcp.workspace import WorkspaceSeed
from envs.registry import ENV_FILE_SUFFIXES, EnvFileError

RewardSpecs = str | LibraryRewardSpec | list[str | LibraryRewardSpec] | None


class EnvFile(Wire):
    """The keys of an env file."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mcp_servers: dict[str, Any] = Field(alias="mcpServers")
    """Server configs, `mcpServers` format plus gymflow's per-server policy (envs.mcp.config)."""
    system_prompt: str = ""
    """The system prompt of every rollout."""
    reward: str | LibraryRewardSpec | list[str | LibraryRewardSpec] | None = None
    """Reward function(s), summed: `module:function` or `file.py:function` (envs.mcp.reward
    signature), or a reward-library function with its parameters (`{fn: exact_match, extract:
    answer_tag}`, envs.mcp.library_reward). Without one, the reward is an exact match of the final
    answer with the ground truth."""
    dataset: str | None = None
    """Default dataset: a JSONL file of tasks."""
    stateless: bool = False
    """Tools keep no per-rollout state: a rollout that lost its servers continues on fresh ones."""
    replayable: bool = False
    """Re-running a rollout's tool calls on fresh servers rebuilds its state exactly."""
    fused_turns: bool = False
    """Run each turn's tool calls in the model turn's activity (BaseEnv.fused_turns); needs `stateless`."""
    workspace: WorkspaceSeed | None = None
    """Files and a setup command every workspace gets before its servers start (envs.mcp.workspace)."""
    workspace_quota_mb: int | None = Field(default=None, ge=1)
    """Disk quota of each rollout's workspace in MB (default: the worker's `workspace_quota_mb`)."""

    @field_validator("reward")
    @classmethod
    def _reward_list(cls, value: RewardSpecs) -> RewardSpecs:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list; leave 'reward' out for the default exact-match reward")
        return value

    @field_validator("fused_turns")
    @classmethod
    def _fused_needs_stateless(cls, value: bool, info: ValidationInfo) -> bool:
        if value and not info.data.get("stateless"):
            raise ValueError("fused_turns re-runs a turn's tool calls on a retry; set 'stateless: true' too")
        return value


class FileEnv(McpEnv):
    """Base of the classes `env_class_from_file` builds."""

    env_file: ClassVar[Path]
    dataset_path: ClassVar[Path | None] = None

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """The file's `dataset` for `default`/`generated`, else the JSONL file `name`."""
        from envs.math.data import load_jsonl  # the generic {"prompt"|"question", "answer"} JSONL loader

        if name in {"default", "generated", ""}:
            if cls.dataset_path is None:
                raise ValueError(f"{cls.env_file}: no 'dataset' key; pass a dataset path")
            return load_jsonl(cls.dataset_path)
        return load_jsonl(Path(name))


def load_env_file(path: Path) -> EnvFile:
    """Parse and validate an env file.

    Raises:
        EnvFileError: The file is missing or unreadable, not YAML/JSON, or a key is unknown or
            invalid; the message names the file and the key.
    """
    if path.suffix.lower() not in ENV_FILE_SUFFIXES:
        raise EnvFileError(f"{path}: an env file must end in {', '.join(ENV_FILE_SUFFIXES)}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot read env file: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise EnvFileError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    if not isinstance(data, dict):
        raise EnvFileError(f"{path}: an env file must be a mapping with an 'mcpServers' key")
    try:
        config = EnvFile.model_validate(data)
        parse_servers({"mcpServers": config.mcp_servers})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors())
        raise EnvFileError(f"{path}: {problems}") from None
    except ValueError as exc:
        raise EnvFileError(f"{path}: {exc}") from None
    return config


def env_class_from_file(path: Path) -> type[FileEnv]:
    """The env class an env file describes; its `name` is the path as given."""
    resolved = path.expanduser().resolve()
    try:
        stat = resolved.stat()
    except OSError:
        raise EnvFileError(f"{path}: env file not found") from None
    return _build(str(path), resolved, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _build(name: str, path: Path, mtime_ns: int, size: int) -> type[FileEnv]:
    # Keyed by mtime and size too: an edited file is re-read, an unchanged one is built once.
    del mtime_ns, size
    config = load_env_file(path)
    base = path.parent
    try:
        reward_fns = _reward_fns(config.reward, base)
        seed = _absolute_seed(config.workspace, base)
    except ValueError as exc:
        raise EnvFileError(f"{path}: {exc}") from None
    servers = {server: _absolute_parsers(cfg, base) for server, cfg in config.mcp_servers.items()}
    attrs: dict[str, Any] = {
        "name": name,
        "env_file": path,
        "system_prompt": config.system_prompt,
        "mcp_servers": servers,
        "reward_fns": reward_fns,
        "workspace_seed": seed,
        "stateless": config.stateless,
        "replayable": config.replayable,
        "fused_turns": config.fused_turns,
        "workspace_quota_mb": config.workspace_quota_mb,
        "dataset_path": (base / config.dataset) if config.dataset else None,
        "__module__": __name__,
    }
    return type(f"FileEnv_{path.stem}", (FileEnv,), attrs)


def _reward_fns(reward: RewardSpecs, base: Path) -> tuple[RewardFn, ...]:
    """The file's reward functions, each checked against the call it will get.

    Raises:
        ValueError: A function cannot be loaded, or cannot take its call; names the entry and the
            signature it needs.
    """
    specs = list(reward) if isinstance(reward, list) else ([] if reward is None else [reward])
    fns: list[RewardFn] = []
    for index, spec in enumerate(specs):
        where = "reward" if not isinstance(reward, list) else f"reward[{index}]"
        if isinstance(spec, LibraryRewardSpec):
            fns.append(LibraryReward(spec, base_dir=base, field=where))
            continue
        fn = load_callable(spec, base_dir=base, field=where)
        problem = check_reward_fn(fn)
        if problem is not None:
            raise ValueError(
                f"{where}: {spec} is {problem}; a reward function is called as {REWARD_SIGNATURE} "
                f"(keywords {', '.join(REWARD_KWARGS)}). To score with a reward-library function "
                "(which takes a prediction and a ground truth), write e.g. `reward: {fn: exact_match, "
                "extract: answer_tag}`"
            )
        fns.append(fn)
    return tuple(fns)


def _absolute_seed(seed: WorkspaceSeed | None, base: Path) -> WorkspaceSeed | None:
    """The seed with its sources resolved against the env file's directory, each checked to exist."""
    if seed is None:
        return None
    files = {}
    for name, source in seed.files.items():
        path = (base / source).resolve()
        if not path.exists():
            raise ValueError(f"workspace.files.{name}: no such file or directory {path}")
        files[name] = str(path)
    return seed.model_copy(update={"files": files})


def _absolute_parsers(server: dict[str, Any], base: Path) -> dict[str, Any]:
    """The server config with relative `file.py:function` parser specs made absolute."""
    parsers = server.get("parsers")
    if not isinstance(parsers, dict):
        return server
    fixed = {}
    for tool, spec in parsers.items():
        target, sep, attr = str(spec).rpartition(":")
        relative_file = sep and target.endswith(".py") and not Path(target).is_absolute()
        fixed[tool] = f"{base / target}:{attr}" if spec not in BUILTIN_PARSERS and relative_file else spec
    return {**server, "parsers": fixed}
