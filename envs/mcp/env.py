"""McpEnv: any set of MCP servers as an RL environment, one isolated instance per rollout.

Each rollout gets a fresh workspace directory and its own server process(es) started with that
directory as their cwd (a `ServerSet`); release kills them and deletes the workspace. A warm
pool keeps `pool_size` sets started ahead of demand, so init usually takes a ready one in
milliseconds. Tools from all servers are offered to the model under their own names (a name two
servers share is prefixed with the server name).

Three ways to define one:

* a subclass with `mcp_servers`, `system_prompt` and `compute_reward` (see envs/examples/units.py);
* `McpEnv.from_config({"mcpServers": ...})` for servers alone;
* an env file (`gymflow.envs.envfile.env_from_file("env.yaml")`): servers, prompt, reward functions,
  dataset and recovery flags from one YAML/JSON file; `gymflow rollout env.yaml` runs it.

Where the servers run is the env's `runtime` (a class attribute, `runtime:` in an env file;
gymflow.envs.runtime.config): local processes by default, or one container per rollout on the
node's engine, every server spawned inside it. The worker hands its node's runtimes in
(`runtimes=`); an env built elsewhere makes its own on first use.

Rewards may inspect the live rollout: `reward_fns` (gymflow.envs.mcp.reward) get the workspace and the
rollout's live servers, and `tools(rollout_id)` gives a subclass's `compute_reward` the same.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from gymflow.envs.contract import BaseEnv, Message, Reward, ToolResult, ToolSpec, Unavailable
from gymflow.envs.errors import InfraError, RolloutNotFound
from gymflow.envs.mcp.config import McpServerConfig, parse_servers
from gymflow.envs.mcp.content import Parser, load_parser
from gymflow.envs.mcp.instance import ServerSet, ServerSetFactory, public_names
from gymflow.envs.mcp.ledger import LEDGER_DIR, Ledger
from gymflow.envs.mcp.library_reward import DEFAULT_REWARD
from gymflow.envs.mcp.pool import WarmPool
from gymflow.envs.mcp.reward import RewardFn, RolloutTools, final_text, score
from gymflow.envs.runtime import workspace as ws
from gymflow.envs.runtime.admission import Admission
from gymflow.envs.runtime.config import RuntimeConfig
from gymflow.envs.runtime.forkserver import node_fork_servers
from gymflow.envs.runtime.node import NodeRuntimes, unavailable_runtime

DEFAULT_POOL_SIZE = 2
"""Server sets kept started per env instance unless `pool_size` says otherwise."""


ROLLOUT_META = "gymflow/rollout_id"
"""The `_meta` key of a shared server's call that names the rollout (`McpEnv.shared_servers`)."""
WORKSPACE_META = "gymflow/workspace"
"""The `_meta` key of a shared server's call that gives the rollout's workspace directory."""


class McpEnv(BaseEnv):
    """An environment whose tools are MCP servers, isolated per rollout."""

    mcp_servers: ClassVar[Mapping[str, Any]] = {}
    """Server configs (`mcpServers` format) for subclasses; `from_config` fills it for an instance."""
    reward_fns: ClassVar[Sequence[RewardFn]] = ()
    """Reward functions (gymflow.envs.mcp.reward signature) the default `compute_reward` sums."""
    workspace_seed: ClassVar[ws.WorkspaceSeed | None] = None
    """Files copied into every workspace and a setup command run in it before its servers start."""
    servers_optional: ClassVar[bool] = False
    """An env whose rollouts may have no servers at all, only a workspace (gymflow.envs.harness)."""
    workspace_quota_mb: ClassVar[int | None] = None
    """This env's own per-rollout disk quota, over the worker's default (`default_workspace_quota_mb`)."""
    runtime: ClassVar[RuntimeConfig | Mapping[str, Any] | None] = None
    """Where every rollout's servers run (gymflow.envs.runtime.config); None: local processes."""
    lazy_servers: ClassVar[bool] = False
    """Start a rollout's servers at its first tool call instead of at its init (and keep no warm
    pool): a rollout that never calls a tool never starts a process, and one waiting on its model
    holds none yet. Host servers only."""
    evict_idle_s: ClassVar[float | None] = None
    """Stop a rollout's servers after this long without a call (servers start lazily then). The
    rollout keeps its workspace and the record of its successful calls; its next call starts the
    servers again and replays the calls, which must give their recorded results (else the call fails
    as an infra error, never with another state). For envs whose servers' state is rebuilt by
    replaying their calls on the kept workspace: stateless envs, or `replayable` ones (enforced)."""
    shared_servers: ClassVar[bool] = False
    """One set of servers per worker serves every rollout of this env, instead of a set per rollout:
    for tools that keep no per-rollout state and are safe to call for many rollouts at once (a
    calculator, a search index). Each rollout still gets its own workspace, and each call carries the
    rollout's id and workspace in its MCP ``_meta`` (`ROLLOUT_META`, `WORKSPACE_META`). Stateless
    envs only (enforced); servers on the host only (a sandbox runtime is refused). A shared server
    that dies or hangs fails the calls in flight: their rollouts are recovered, and the next init
    starts the set again."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.shared_servers and not cls.stateless:
            raise TypeError(f"{cls.__name__}: shared_servers serve many rollouts at once: stateless envs only")
        if cls.evict_idle_s is not None and not (cls.stateless or cls.replayable):
            raise TypeError(f"{cls.__name__}: evict_idle_s replays a rollout's calls: stateless or replayable envs")

    def __init__(
        self,
        *,
        workspace_root: Path | None = None,
        servers: Mapping[str, Any] | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        workspace_quota_mb: int | None = None,
        default_workspace_quota_mb: int = ws.DEFAULT_QUOTA_MB,
        admission: Admission | None = None,
        runtimes: NodeRuntimes | None = None,
        **kwargs: Any,
    ) -> None:
        """Args:
        workspace_root: Parent of this env's rollout workspaces (and of its ledger).
        servers: `mcpServers` mapping; default the class's `mcp_servers`.
        pool_size: Server sets kept started ahead of demand (0: start one per init).
        workspace_quota_mb: Disk quota of each rollout's workspace; default the class's
            `workspace_quota_mb`, else `default_workspace_quota_mb`.
        default_workspace_quota_mb: The worker's quota for envs that set none.
        admission: The node's admission control, shared by every env of a worker (default: one
            of this env's own, sized to the machine).
        runtimes: The node's runtimes, shared by every env of a worker (default: made on first
            use, when a server runs in a sandbox, and closed at `shutdown`).
        """
        super().__init__(**kwargs)
        self.runtime_config = self.resolve_runtime()
        self._runtimes = runtimes
        self._own_runtimes: NodeRuntimes | None = None
        self.admission = admission or Admission()
        self.quota_mb: int = self.resolve_quota(workspace_quota_mb, default_workspace_quota_mb)
        configured = servers if servers is not None else self.mcp_servers
        self.servers: dict[str, McpServerConfig] = (
            parse_servers(configured) if configured or not self.servers_optional else {}
        )
        parsers: dict[str, dict[str, Parser]] = {
            name: {
                tool: load_parser(spec, field=f"mcpServers.{name}.parsers.{tool}") for tool, spec in cfg.parsers.items()
            }
            for name, cfg in self.servers.items()
        }
        self.workspace_root = workspace_root or Path(tempfile.gettempdir()) / "gymflow-workspaces"
        self._factory = ServerSetFactory(
            self.servers,
            parsers=parsers,
            workspace_root=self.workspace_root,
            ledger=Ledger(self.workspace_root / LEDGER_DIR),
            seed=self.workspace_seed,
            admission=self.admission,
            runtime=self.runtime_config,
            runtimes=self.node_runtimes,
        )
        lazy = self.lazy_servers or self.evict_idle_s is not None
        self.pool = WarmPool(size=0 if lazy else pool_size, start=self._factory.start, stop=self._factory.stop)
        self._rollouts: dict[str, ServerSet] = {}
        self._tool_cache: list[ToolSpec] | None = None
        self._shared: ServerSet | None = None
        self._shared_lock: asyncio.Lock | None = None
        self._evictor: asyncio.Task[None] | None = None

    @classmethod
    def resolve_runtime(cls) -> RuntimeConfig | None:
        """The class's `runtime`, validated (a bad one is a ValueError naming the field)."""
        if cls.runtime is None or isinstance(cls.runtime, RuntimeConfig):
            return cls.runtime
        try:
            return RuntimeConfig.model_validate(cls.runtime)
        except ValidationError as exc:
            problems = "; ".join(f"runtime.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise ValueError(problems) from None

    @classmethod
    def unavailable(cls, **env_kwargs: Any) -> Unavailable | None:
        """A container or bwrap runtime (the env's or a server's) on a node that lacks it: the install command."""
        del env_kwargs
        try:
            runtime = cls.resolve_runtime()
            servers = parse_servers(cls.mcp_servers) if cls.mcp_servers else {}
        except ValueError:
            return None  # a bad config is reported where the env is built
        kinds = {c.runtime.kind for c in servers.values() if c.runtime is not None}
        if runtime is not None:
            kinds.add(runtime.kind)
        return next(filter(None, (unavailable_runtime(kind) for kind in sorted(kinds))), None)

    def node_runtimes(self) -> NodeRuntimes:
        """The node's runtimes (this env's own when the worker gave none)."""
        if self._runtimes is not None:
            return self._runtimes
        if self._own_runtimes is None:
            self._own_runtimes = NodeRuntimes.local()
        return self._own_runtimes

    @classmethod
    def resolve_quota(cls, explicit: int | None, default: int = ws.DEFAULT_QUOTA_MB) -> int:
        """The workspace quota in MB: `explicit`, else the class's `workspace_quota_mb`, else `default`."""
        quota = explicit or cls.workspace_quota_mb or default
        if quota < 1:
            raise ValueError(f"workspace_quota_mb must be at least 1, got {quota}")
        return quota

    @classmethod
    def declared_tools(cls) -> list[str] | None:
        """The tools' model-facing names when every server of `mcp_servers` names its `allowed_tools`
        (listings need not start anything), else None: only the running servers can tell."""
        try:
            servers = parse_servers(cls.mcp_servers)
        except ValueError:
            return None
        if any(config.allowed_tools is None for config in servers.values()):
            return None
        return list(public_names({name: config.allowed_tools or [] for name, config in servers.items()}))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> McpEnv:
        """An env from an `mcpServers` mapping alone (no reward beyond the default)."""
        return cls(servers=config, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------
    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Take a started server set (pooled or fresh) and stage `files` ({name: content}) into it."""
        files: Mapping[str, str | bytes] = rollout_args.pop("files", {}) or {}
        if rollout_args:
            raise TypeError(f"{type(self).__name__}.init_rollout got unexpected arguments {sorted(rollout_args)}")
        if rollout_id in self._rollouts:  # a retried init: start over cleanly
            await self.release_rollout(rollout_id)
        if self.shared_servers:
            sset = await self._factory.attach(await self._shared_set())
        elif self.lazy_servers or self.evict_idle_s is not None:
            sset = await self._factory.start_lazy(record_calls=self.evict_idle_s is not None and not self.stateless)
            self._watch_idle()
        else:
            sset = await self.pool.acquire()
        self._rollouts[rollout_id] = sset
        try:
            for name, content in files.items():
                ws.write_in(sset.workspace, content, name)
            ws.check_quota(sset.workspace, self.quota_mb)
        except BaseException:
            await self.release_rollout(rollout_id)
            raise
        if self._tool_cache is None and sset.restart is None:  # a lazy set has no tools to read yet
            self._tool_cache = sset.specs()

    async def release_rollout(self, rollout_id: str) -> None:
        sset = self._rollouts.pop(rollout_id, None)
        if sset is not None:
            await self._factory.stop(sset)

    async def _shared_set(self) -> ServerSet:
        """The env's shared servers, started on first use and again after they died."""
        self._factory.refuse_sandboxes(f"{type(self).__name__}: shared servers")
        self._shared_lock = self._shared_lock or asyncio.Lock()
        async with self._shared_lock:
            if self._shared is not None and not self._shared.alive:
                dead, self._shared = self._shared, None
                await self._factory.stop(dead)
            if self._shared is None:
                self._shared = await self._factory.start()
            return self._shared

    def _watch_idle(self) -> None:
        """Start the task that evicts idle servers (`evict_idle_s`), once."""
        if self.evict_idle_s is None or (self._evictor is not None and not self._evictor.done()):
            return
        self._evictor = asyncio.get_running_loop().create_task(self._evict_idle(self.evict_idle_s))

    async def _evict_idle(self, idle_s: float) -> None:
        while True:
            await asyncio.sleep(min(max(idle_s / 2, 0.05), 5.0))
            now = time.monotonic()
            for sset in list(self._rollouts.values()):
                if sset.restart is None and not sset.busy and now - sset.last_used >= idle_s:
                    await self._factory.evict(sset)

    async def warm(self, timeout_s: float = 60.0) -> None:
        """Fill the warm pool now (otherwise it fills after the first rollout starts)."""
        await self.pool.warm(timeout_s)

    async def shutdown(self) -> None:
        if self._evictor is not None:
            self._evictor.cancel()
        await self.pool.close()
        await asyncio.gather(*(self.release_rollout(r) for r in list(self._rollouts)), return_exceptions=True)
        if self._shared is not None:
            shared, self._shared = self._shared, None
            await self._factory.stop(shared)
        self._factory.ledger.close()
        node_fork_servers().stop(self._factory.fork_targets)  # none of its programs' processes outlive it
        if self._own_runtimes is not None:
            await self._own_runtimes.close()

    def live_rollouts(self) -> Sequence[str]:
        """Ids of the rollouts this instance holds."""
        return list(self._rollouts)

    def server_pids(self, rollout_id: str) -> dict[str, int | None]:
        """Server name -> pid for a rollout (for crash tests and orphan reaping)."""
        return {name: s.pid for name, s in self._get(rollout_id).sessions.items()}

    # -- tools -------------------------------------------------------------------------------
    async def list_tools(self) -> list[ToolSpec]:
        if self._tool_cache is None and self.shared_servers:
            self._tool_cache = (await self._shared_set()).specs()
        if self._tool_cache is None:
            sset = await self.pool.acquire()
            self._tool_cache = sset.specs()
            await self._factory.stop(sset)
        return list(self._tool_cache)

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> ToolResult:
        """Call the tool; a call that leaves the workspace over its quota is an error observation."""
        sset = self._get(rollout_id)
        meta = {ROLLOUT_META: rollout_id, WORKSPACE_META: str(sset.workspace)} if sset.shared else None
        result = await sset.call(tool_name, tool_args, meta)
        over = await asyncio.to_thread(ws.over_quota, sset.workspace, self.quota_mb)
        if over is None:
            return result
        return result.model_copy(update={"is_error": True, "text": f"{result.text}\n[gymflow: {over}]".lstrip()})

    def tools(self, rollout_id: str) -> RolloutTools:
        """The rollout's live servers, for rewards that inspect state through tools."""
        return RolloutTools(self._get(rollout_id))

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward | Mapping[str, float]:
        """The sum of `reward_fns`; without any, exact match of the final answer with the ground truth
        (the last `<answer>` of the last assistant message, or that message whole without one;
        gymflow.envs.mcp.library_reward)."""
        if self.reward_fns:
            sset = self._get(rollout_id)
            await sset.ensure_started()  # a lazy or evicted set: its servers, state replayed
            if not sset.alive:  # a reward that reads a dead server's state would score garbage
                raise InfraError(next(s.describe_death() for s in sset.sessions.values() if not s.alive))
            return await score(
                self.reward_fns,
                messages=completion,
                ground_truth=ground_truth,
                tools=RolloutTools(sset),
                rollout_id=rollout_id,
                **kwargs,
            )
        return {DEFAULT_REWARD.__name__: DEFAULT_REWARD(final_text(completion), ground_truth)}

    # -- workspace ---------------------------------------------------------------------------
    def placeholders(self, rollout_id: str) -> dict[str, str]:
        """`{workspace}`: the rollout's workspace directory, for prompts that need its absolute path."""
        return {"workspace": str(self.workspace(rollout_id))}

    def workspace(self, rollout_id: str) -> Path:
        """The rollout's workspace directory."""
        return self._get(rollout_id).workspace

    async def copy_to_workspace(self, rollout_id: str, src_path: Path, dst_filename: str | None = None) -> None:
        ws.copy_in(self.workspace(rollout_id), src_path, dst_filename)

    async def copy_content_to_workspace(self, rollout_id: str, src_content: str | bytes, dst_filename: str) -> None:
        ws.write_in(self.workspace(rollout_id), src_content, dst_filename)

    async def copy_from_workspace(self, rollout_id: str, src_filename: str, dst_path: Path) -> None:
        ws.copy_out(self.workspace(rollout_id), src_filename, dst_path)

    # -- internals ---------------------------------------------------------------------------
    def _get(self, rollout_id: str) -> ServerSet:
        sset = self._rollouts.get(rollout_id)
        if sset is None:
            raise RolloutNotFound(f"rollout {rollout_id!r} is not held by this worker")
        return sset
