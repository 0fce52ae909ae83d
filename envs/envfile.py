"""An environment from one YAML/JSON file: MCP servers plus gymflow's keys, no Python class.

    # env.yaml — `gymflow rollout env.yaml`, `env_from_file("env.yaml")`
    mcpServers:                       # Claude Desktop / benchmax mcp_config.yaml format
      calculator: {command: mcp-server-calculator}
      letters: {command: python, args: [letters_server.py]}   # a server file next to env.yaml
    description: Arithmetic with a calculator server.   # one line for `gymflow envs`
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
    runtime:                          # where the servers run (gymflow.envs.runtime.config); default: local processes
      kind: container                 # one container per rollout; every server's command runs inside it
      build: ./image                  # or image: NAME; a build context next to env.yaml, built once per node
      limits: {memory_mb: 1024, storage_mb: 2048, pids: 256}
    policies:                         # scripted policies: `--policy NAME`, `gymflow policy serve env.yaml`
      reference: my_policy.py:MyPolicy  # module:Class or file.py:Class (a gymflow.envs.policy.Policy)
    harness:                          # instead of (or beside) mcpServers: an agent program plays each
      command: [python, agent.py]     # rollout, its model calls through the gateway (gymflow.envs.harness)

`{workspace}` (the rollout's workspace directory) and `{rollout_id}` are filled in in the system
prompt and the tasks' prompts, as in server `args` and `env`. Every reward function is checked
against the call it will get when the file loads: one that cannot take it is an error naming the
signature it needs. Without `reward:` the final answer (the last `<answer>` of the last assistant
message, or that message whole) must equal the ground truth.

Paths in an env file are relative to the env file's directory, wherever gymflow runs from:

* reward, parser and policy files, seed files and the dataset;
* a server's `cwd`, and a `command` with a slash in it (`./server.sh`; a bare name is looked up
  in PATH);
* a server argument that names a file or directory there (`letters_server.py`, `data/words.txt`,
  also as `--opt=data/words.txt`) is passed to the server as that absolute path.

A server runs in the rollout's workspace (its working directory, unless `cwd` says otherwise), so
any other relative argument names a file in the workspace (`--db shop.db`: a database each
rollout gets on its own), as does `.`. `{workspace}` is the workspace's absolute path, in `args`,
`env` and `cwd`. The env is identified by its path: the workflow input names the file, and each
worker loads the same path (relative to its own working directory), so ship the file with the
workers (the SkyPilot workdir). Unknown keys and bad values are errors that name the key.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from gymflow.envs.contract import BaseEnv, Task, Wire
from gymflow.envs.errors import EnvFileError
from gymflow.envs.harness.env import Harness, HarnessEnv
from gymflow.envs.mcp.config import BUILTIN_PARSERS, WORKSPACE, parse_servers
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.mcp.library_reward import LibraryReward, LibraryRewardSpec
from gymflow.envs.mcp.reward import REWARD_KWARGS, REWARD_SIGNATURE, RewardFn, check_reward_fn
from gymflow.envs.plugins import load_callable
from gymflow.envs.policy import DEFAULT, NULL, Policy, PolicySpec
from gymflow.envs.runtime.config import RuntimeConfig
from gymflow.envs.runtime.workspace import WorkspaceSeed

RewardSpecs = str | LibraryRewardSpec | list[str | LibraryRewardSpec] | None


PARSERS: dict[str, Callable[[str], Any]] = {".yaml": yaml.safe_load, ".yml": yaml.safe_load, ".json": json.loads}
"""The env file formats, by suffix (gymflow.envs.registry reads a name with one of them as an env file)."""


class EnvFile(Wire):
    """The keys of an env file."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mcp_servers: dict[str, Any] = Field(default_factory=dict, alias="mcpServers")
    """Server configs, `mcpServers` format plus gymflow's per-server policy (gymflow.envs.mcp.config)."""
    harness: Harness | None = None
    """An agent program that plays every rollout (gymflow.envs.harness); then `mcpServers` may be empty."""
    base: Literal["harbor"] | None = None
    """With `harness`: the env the program plays instead of the file's own workspace. ``harbor``: each
    rollout is a Harbor task's container (the `dataset` is a directory of tasks) and the task's verifier
    is the reward (gymflow.envs.builtin.harbor.harness)."""
    description: str = ""
    """One line about the env, for `gymflow envs`."""
    system_prompt: str = ""
    """The system prompt of every rollout."""
    reward: str | LibraryRewardSpec | list[str | LibraryRewardSpec] | None = None
    """Reward function(s), summed: `module:function` or `file.py:function` (gymflow.envs.mcp.reward
    signature), or a reward-library function with its parameters (`{fn: exact_match, extract:
    answer_tag}`, gymflow.envs.mcp.library_reward). Without one, the reward is an exact match of the final
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
    """Files and a setup command every workspace gets before its servers start (gymflow.envs.runtime.workspace)."""
    workspace_quota_mb: int | None = Field(default=None, ge=1)
    """Disk quota of each rollout's workspace in MB (default: the worker's `workspace_quota_mb`)."""
    runtime: RuntimeConfig | None = None
    """Where every rollout's servers run: local processes (default) or a container per rollout
    (gymflow.envs.runtime.config); a server's own `runtime` overrides it."""
    policies: dict[str, str] = Field(default_factory=dict)
    """Scripted policies, name -> `module:Class` or `file.py:Class` (gymflow.envs.policy): the first is the
    default of `--policy`, and `gymflow policy serve ENV --policy NAME` serves any of them."""

    @field_validator("policies")
    @classmethod
    def _policy_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name in {DEFAULT, NULL}:
                raise ValueError(f"{name!r} is built in ({DEFAULT}: the first policy; {NULL}: no answer)")
            if not name or not name.replace("-", "_").isidentifier():
                raise ValueError(f"policy name {name!r} must be a word (letters, digits, - and _)")
        return value

    @field_validator("reward")
    @classmethod
    def _reward_list(cls, value: RewardSpecs) -> RewardSpecs:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list; leave 'reward' out for the default exact-match reward")
        return value

    @model_validator(mode="after")
    def _servers_or_harness(self) -> EnvFile:
        if not self.mcp_servers and self.harness is None:
            raise ValueError("an env file needs 'mcpServers' (tools for the model) or 'harness' (an agent program)")
        if self.base is not None and self.harness is None:
            raise ValueError("'base' names the env a harness program plays: it needs 'harness'")
        if self.base is not None and (self.reward is not None or self.mcp_servers or self.workspace is not None):
            raise ValueError(f"with 'base: {self.base}' the task's verifier is the reward and its container the "
                             "workspace: leave out 'reward', 'mcpServers' and 'workspace'")  # fmt: skip
        return self

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
        from gymflow.envs.builtin.math.data import (
            load_jsonl,  # the generic {"prompt"|"question", "answer"} JSONL loader
        )

        if name in {"default", "generated", ""}:
            if cls.dataset_path is None:
                raise ValueError(f"{cls.env_file}: no 'dataset' key; pass a dataset path")
            return load_jsonl(cls.dataset_path)
        return load_jsonl(Path(name))


class HarnessFileEnv(HarnessEnv, FileEnv):
    """Base of the classes `env_class_from_file` builds from files with a `harness` key."""


def env_from_file(path: str | Path, **kwargs: Any) -> BaseEnv:
    """The env an env file describes, built with `kwargs` (an `McpEnv`, or a `HarnessEnv` with a
    `harness` key); raises `EnvFileError` naming a bad key."""
    return env_class_from_file(Path(path))(**kwargs)


def load_env_file(path: Path) -> EnvFile:
    """Parse and validate an env file.

    Raises:
        EnvFileError: The file is missing or unreadable, not YAML/JSON, or a key is unknown or
            invalid; the message names the file and the key.
    """
    parse = PARSERS.get(path.suffix.lower())
    if parse is None:
        raise EnvFileError(f"{path}: an env file must end in {', '.join(PARSERS)}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot read env file: {exc.strerror or exc}") from exc
    try:
        data = parse(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise EnvFileError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from exc
    if not isinstance(data, dict):
        raise EnvFileError(f"{path}: an env file must be a mapping with an 'mcpServers' or a 'harness' key")
    try:
        config = EnvFile.model_validate(data)
        if config.mcp_servers:
            parse_servers({"mcpServers": config.mcp_servers})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors())
        raise EnvFileError(f"{path}: {problems}") from None
    except ValueError as exc:
        raise EnvFileError(f"{path}: {exc}") from None
    return config


def env_class_from_file(path: Path) -> type[BaseEnv]:
    """The env class an env file describes; its `name` is the path as given."""
    resolved = path.expanduser().resolve()
    try:
        stat = resolved.stat()
    except OSError:
        raise EnvFileError(f"{path}: env file not found") from None
    return _build(str(path), resolved, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _build(name: str, path: Path, mtime_ns: int, size: int) -> type[BaseEnv]:
    # Keyed by mtime and size too: an edited file is re-read, an unchanged one is built once.
    del mtime_ns, size
    config = load_env_file(path)
    base = path.parent
    if config.harness is not None and config.base == "harbor":
        return _harbor_harness(name, path, config)
    try:
        reward_fns = _reward_fns(config.reward, base)
        seed = _absolute_seed(config.workspace, base)
        policies = _policies(config.policies, base)
        seeded = set(seed.files) if seed is not None else set()
        servers = {server: _absolute_paths(server, cfg, base, seeded) for server, cfg in config.mcp_servers.items()}
    except ValueError as exc:
        raise EnvFileError(f"{path}: {exc}") from None
    attrs: dict[str, Any] = {
        "name": name,
        "__doc__": config.description or f"MCP servers {', '.join(servers)} (env file {name}).",
        "env_file": path,
        "system_prompt": config.system_prompt,
        "mcp_servers": servers,
        "reward_fns": reward_fns,
        "workspace_seed": seed,
        "stateless": config.stateless,
        "replayable": config.replayable,
        "fused_turns": config.fused_turns,
        "workspace_quota_mb": config.workspace_quota_mb,
        "policies": policies,
        "runtime": _absolute_build(config.runtime, base),
        "dataset_path": (base / config.dataset) if config.dataset else None,
        "__module__": __name__,
    }
    if config.harness is not None:
        attrs["harness"] = _absolute_harness(config.harness, base)
        attrs["replayable"] = True  # the restarted program rebuilds the state (gymflow.envs.harness)
        return type(f"HarnessFileEnv_{path.stem}", (HarnessFileEnv,), attrs)
    return type(f"FileEnv_{path.stem}", (FileEnv,), attrs)


def _harbor_harness(name: str, path: Path, config: EnvFile) -> type[BaseEnv]:
    """The class of an env file whose harness plays Harbor tasks (gymflow.envs.builtin.harbor.harness)."""
    from gymflow.envs.builtin.harbor.harness import HarborHarnessEnv  # the container runtime: loaded only for these

    assert config.harness is not None
    base = path.parent
    try:
        policies = _policies(config.policies, base)
    except ValueError as exc:
        raise EnvFileError(f"{path}: {exc}") from None
    attrs: dict[str, Any] = {
        "name": name,
        "__doc__": config.description or f"Harbor tasks played by {config.harness.command!r} (env file {name}).",
        "harness": _absolute_harness(config.harness, base),
        "dataset_path": (base / config.dataset).resolve() if config.dataset else None,
        "__module__": __name__,
        **({"policies": policies} if policies else {}),
        **({"system_prompt": config.system_prompt} if config.system_prompt else {}),
    }
    return type(f"HarborHarnessFileEnv_{path.stem}", (HarborHarnessEnv,), attrs)


def _absolute_harness(harness: Harness, base: Path) -> Harness:
    """The harness with a command (or argument) naming a file next to the env file made absolute."""
    if isinstance(harness.command, str):
        return harness
    command = list(harness.command)
    if "/" in command[0] and not Path(command[0]).is_absolute():
        command[0] = str(base / command[0])
    command[1:] = [_absolute_arg(arg, base) for arg in command[1:]]
    return harness.model_copy(update={"command": command})


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


def _policies(specs: dict[str, str], base: Path) -> dict[str, PolicySpec]:
    """The file's policies with relative `file.py:Class` specs made absolute, each checked to load.

    Raises:
        ValueError: A spec cannot be loaded; names the key.
    """
    policies: dict[str, PolicySpec] = {}
    for name, spec in specs.items():
        policies[name] = absolute = _absolute_spec(spec, base)
        target = load_callable(absolute, field=f"policies.{name}")
        if isinstance(target, type) and not issubclass(target, Policy):
            raise ValueError(f"policies.{name}: {spec} is not a gymflow.envs.policy.Policy subclass")  # noqa: TRY004
    return policies  # made on use (`--policy`), not here: a worker never plays them


def _absolute_build(runtime: RuntimeConfig | None, base: Path) -> RuntimeConfig | None:
    """The runtime with its build context resolved against the env file's directory, checked to exist."""
    if runtime is None or runtime.build is None:
        return runtime
    context = (base / runtime.build).resolve()
    if not (context / "Dockerfile").is_file():
        raise ValueError(f"runtime.build: no Dockerfile in {context}")
    return runtime.model_copy(update={"build": str(context)})


def _absolute_spec(spec: str, base: Path) -> str:
    """`file.py:name` made absolute against `base`; any other spec as it is."""
    target, sep, attr = spec.rpartition(":")
    relative_file = sep and target.endswith(".py") and not Path(target).is_absolute()
    return f"{base / target}:{attr}" if relative_file else spec


def _absolute_paths(name: str, server: dict[str, Any], base: Path, seeded: set[str]) -> dict[str, Any]:
    """The server config with its paths relative to the env file made absolute (module docstring):
    `file.py:function` parsers, `cwd`, a `command` with a slash, arguments naming a file there.

    Raises:
        ValueError: An argument names a Python file that is neither next to the env file nor seeded
            into the workspace (a typo, or a path written relative to somewhere else).
    """
    fixed = dict(server)
    runtime = server.get("runtime")
    if isinstance(runtime, dict) and isinstance(runtime.get("build"), str):
        fixed["runtime"] = {**runtime, "build": str((base / runtime["build"]).resolve())}
    parsers = server.get("parsers")
    if isinstance(parsers, dict):
        fixed["parsers"] = {
            tool: spec if spec in BUILTIN_PARSERS else _absolute_spec(str(spec), base) for tool, spec in parsers.items()
        }
    cwd = server.get("cwd")
    if isinstance(cwd, str) and not cwd.startswith(WORKSPACE) and not Path(cwd).is_absolute():
        fixed["cwd"] = str(base / cwd)
    command = server.get("command")
    if isinstance(command, str) and "/" in command and not Path(command).is_absolute():
        fixed["command"] = str(base / command)
    args = server.get("args")
    if isinstance(args, list):
        fixed["args"] = [_absolute_arg(arg, base) if isinstance(arg, str) else arg for arg in args]
        for index, (given, made) in enumerate(zip(args, fixed["args"], strict=True)):
            if given == made and isinstance(given, str) and _missing_script(given, seeded):
                raise ValueError(
                    f"mcpServers.{name}.args[{index}]: no file {base / given}; a relative path is relative "
                    "to the env file (write `{workspace}/" + given + "` for a file the workspace setup makes)"
                )
    return fixed


def _missing_script(arg: str, seeded: set[str]) -> bool:
    """Whether `arg` is a relative `.py` path that nothing provides (not a seeded workspace file)."""
    if not arg.endswith(".py") or arg.startswith("-") or "{" in arg:
        return False
    return arg not in seeded and not Path(arg).is_absolute()


def _absolute_arg(arg: str, base: Path) -> str:
    """`arg` (or the value of `--opt=value`) as an absolute path when it names a file or directory
    relative to `base`; `.`, `..` and anything with a placeholder stay as they are."""
    option, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    if not value or "{" in value or value.startswith("-") or Path(value).is_absolute():
        return arg
    candidate = base / value
    try:
        resolved = candidate.resolve()
        exists = resolved.exists()
    except OSError:  # too long a name, a loop: not a file of ours
        return arg
    if not exists or resolved in {base, *base.parents}:  # `.` and `..` mean the workspace's
        return arg
    return f"{option}{eq}{candidate}"
