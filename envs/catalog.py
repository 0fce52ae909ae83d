"""What each env is, for `gymflow envs`: its description, tools, dataset size and policies.

Everything but the tools is read from the env class: the first line of its docstring (an env
file's `description`), its `policies` (gymflow.envs.policy), and its `generated` dataset (what `gymflow
eval ENV` runs without `--dataset`) counted at its default size. An env's tools are known only
once they run (`BaseEnv.list_tools`), so each env is started once in a throwaway workspace root
and shut down again, every env at the same time, each within a deadline; McpEnvs with the same
servers (`units` runs math's calculator) start them once between them, and an McpEnv whose
servers all declare `allowed_tools` is listed from that declaration and starts nothing. Nothing
is cached on disk: a listing is what the envs say now.

A part that fails (a class that does not import, a server that does not start, a dataset that
does not load) is reported in its field (`error`, `tools_error`, `dataset_error`): one broken env
never hides the others.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from gymflow.envs.contract import BaseEnv, ToolSpec
from gymflow.envs.errors import EnvFileError, UnknownEnvError
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.policy import policy_aliases, policy_target
from gymflow.envs.registry import BUILTIN, available, env_class, is_env_file, storage_name

DEFAULT_DATASET = "generated"
"""The dataset `gymflow eval` and `rollout` run without `--dataset`."""
TOOLS_TIMEOUT_S = 30.0
"""How long an env may take to start and list its tools before the listing gives up on it."""

Listing = tuple[list[ToolSpec] | None, bool, str | None]
"""(tools, declared without starting, why they could not be listed)."""


class PolicyInfo(BaseModel):
    """One scripted policy of an env under all of its names."""

    names: list[str]
    """Its names, the first as declared; aliases (e.g. `reference`) after it."""
    target: str
    """What makes it, `module:Class`."""
    default: bool = False
    """Whether `--policy` picks it when not given."""


class EnvInfo(BaseModel):
    """What `gymflow envs` and `gymflow envs show NAME` say about one env."""

    name: str
    target: str = ""
    """`module:Class`, or the env file's path."""
    source: str = ""
    """`built-in`, `registered` (this process or an entry point), `env file`, or `env package NAME
    VERSION, KIND, digest ...` (gymflow.envs.packages)."""
    description: str = ""
    """The first line of the env's docstring."""
    doc: str = ""
    """The whole docstring."""
    error: str | None = None
    """Why the env could not be loaded at all."""
    tools: list[ToolSpec] | None = None
    """Its tools (only names when the env declares them without starting: `tools_declared`)."""
    tools_declared: bool = False
    tools_error: str | None = None
    dataset: str = DEFAULT_DATASET
    tasks: int | None = None
    """Tasks in `dataset` at its default size."""
    dataset_doc: str = ""
    """What `load_dataset` takes (its docstring)."""
    dataset_error: str | None = None
    policies: list[PolicyInfo] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    """The recovery and scheduling flags it sets (stateless, replayable, fused_turns, cpu_bound)."""
    servers: dict[str, str] = Field(default_factory=dict)
    """MCP server name -> how it is started or reached (McpEnv)."""
    system_prompt: str = ""
    node: list[str] = Field(default_factory=list)
    """What this node gives the env (`BaseEnv.node_facts`)."""


async def describe(name: str, *, tools_timeout_s: float = TOOLS_TIMEOUT_S) -> EnvInfo:
    """Everything the catalog knows about env `name` (a registered name or an env file).

    Raises:
        UnknownEnvError: Nothing is registered as `name`.
        EnvFileError: `name` is an env file that is missing or invalid.
    """
    cls = env_class(name)
    return await _describe(name, cls, tools_timeout_s=tools_timeout_s, shared={})


async def describe_all(
    names: Sequence[str] | None = None, *, tools_timeout_s: float = TOOLS_TIMEOUT_S
) -> list[EnvInfo]:
    """`describe` for every env (default: all registered ones), all at once; an env that cannot
    be loaded is an `EnvInfo` with `error` set, not an exception."""
    shared: dict[str, asyncio.Future[Listing]] = {}
    return list(await asyncio.gather(*(_safe(n, tools_timeout_s, shared) for n in (names or available()))))


async def _safe(name: str, tools_timeout_s: float, shared: dict[str, asyncio.Future[Listing]]) -> EnvInfo:
    try:
        cls = env_class(name)
    except (UnknownEnvError, EnvFileError) as exc:
        return EnvInfo(name=name, error=str(exc))
    except Exception as exc:  # a third-party entry point that does not import: say so, list the rest
        return EnvInfo(name=name, error=f"{type(exc).__name__}: {exc}")
    return await _describe(name, cls, tools_timeout_s=tools_timeout_s, shared=shared)


async def _describe(
    name: str, cls: type[BaseEnv], *, tools_timeout_s: float, shared: dict[str, asyncio.Future[Listing]]
) -> EnvInfo:
    doc = _own_doc(cls)
    info = EnvInfo(
        name=name,
        target=name if is_env_file(name) else getattr(cls, "origin", None) or f"{cls.__module__}:{cls.__qualname__}",
        source=_source(name, cls),
        description=doc.splitlines()[0] if doc else "",
        doc=doc,
        policies=_policies(cls),
        flags=[flag for flag in ("stateless", "replayable", "fused_turns", "cpu_bound") if getattr(cls, flag, False)],
        servers=_servers(cls),
        system_prompt=cls.system_prompt,
        dataset_doc=inspect.getdoc(cls.load_dataset) or "",
    )
    tools, tasks, info.node = await asyncio.gather(
        _tools(name, cls, tools_timeout_s, shared),
        asyncio.to_thread(_count_tasks, cls),
        asyncio.to_thread(cls.node_facts),
    )
    info.tools, info.tools_declared, info.tools_error = tools
    info.tasks, info.dataset_error = tasks
    return info


def _source(name: str, cls: type[BaseEnv]) -> str:
    if cls.package is not None:  # an env package in its own venv (gymflow.envs.packages)
        ref = cls.package
        return f"env package {ref.name} {ref.version}, {ref.kind}, digest {ref.digest[:12]}"
    return "env file" if is_env_file(name) else "built-in" if name in BUILTIN else "registered"


def _own_doc(cls: type[BaseEnv]) -> str:
    """The class's own docstring, else its module's (an env's file often says what it is)."""
    doc = cls.__dict__.get("__doc__") or getattr(sys.modules.get(cls.__module__), "__doc__", None) or ""
    return inspect.cleandoc(doc) if doc else ""


def _policies(cls: type[BaseEnv]) -> list[PolicyInfo]:
    first = next(iter(cls.policies), None)
    return [
        PolicyInfo(
            names=names,
            target=policy_target(cls.policies[head]) if head in cls.policies else "gymflow.envs.policy:NullPolicy",
            default=head == first,
        )
        for head, names in policy_aliases(cls).items()
    ]


def _servers(cls: type[BaseEnv]) -> dict[str, str]:
    configs = getattr(cls, "mcp_servers", None)
    if not isinstance(configs, dict):
        return {}
    out = {}
    for server, config in configs.items():
        if not isinstance(config, dict):
            continue
        command = [config.get("command") or "", *map(str, config.get("args") or [])]
        url = config.get("url")
        out[str(server)] = " ".join(filter(None, [shlex.join(c for c in command if c), url and f"({url})"]))
    return out


async def _tools(
    name: str, cls: type[BaseEnv], timeout_s: float, shared: dict[str, asyncio.Future[Listing]]
) -> Listing:
    """The declared names if any, else what a started instance lists (once per set of servers)."""
    recorded = getattr(cls, "recorded_tools", None)
    if callable(recorded):  # what an env package's install listed (gymflow.envs.packages.env)
        return list(recorded()), False, None
    declared = getattr(cls, "declared_tools", None)
    names = declared() if callable(declared) else None
    if names is not None:
        return [ToolSpec(name=tool) for tool in names], True, None
    with tempfile.TemporaryDirectory(prefix="gymflow-envs-") as root:
        try:
            env = cls(workspace_root=Path(root) / storage_name(name), pool_size=0)
        except Exception as exc:  # an env that cannot be built here says why in its row
            return None, False, f"{type(exc).__name__}: {exc}"
        try:
            key = _servers_key(env)
            if key is None:
                return await _list(env, timeout_s)
            if key not in shared:
                shared[key] = asyncio.ensure_future(_list(env, timeout_s))
            return await asyncio.shield(shared[key])
        finally:
            await env.shutdown()


async def _list(env: BaseEnv, timeout_s: float) -> Listing:
    try:
        specs = await asyncio.wait_for(env.list_tools(), timeout_s)
    except TimeoutError:
        return None, False, f"did not list its tools within {timeout_s:g}s"
    except Exception as exc:  # a server that does not start: its reason, and the rest of the listing
        return None, False, str(exc) or type(exc).__name__
    return list(specs), False, None


def _servers_key(env: BaseEnv) -> str | None:
    """What an McpEnv's tools depend on (its servers and workspace seed), for envs that list them
    McpEnv's way; None for any other env."""
    if not isinstance(env, McpEnv) or type(env).list_tools is not McpEnv.list_tools:
        return None
    servers = {name: config.model_dump(mode="json") for name, config in env.servers.items()}
    seed = env.workspace_seed.model_dump(mode="json") if env.workspace_seed is not None else None
    return json.dumps([servers, seed], sort_keys=True)


def _count_tasks(cls: type[BaseEnv]) -> tuple[int | None, str | None]:
    try:
        return sum(1 for _ in cls.load_dataset(DEFAULT_DATASET)), None
    except Exception as exc:  # no default dataset (an env file without `dataset:`): said, not fatal
        return None, str(exc) or type(exc).__name__
