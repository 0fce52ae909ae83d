"""One isolated copy of an env's MCP servers: a fresh workspace and one session per server.

A rollout owns exactly one ServerSet from init to release; the warm pool keeps a few started
ahead of demand. Under an env `runtime` (gymflow.envs.runtime.config) the set also owns the
rollout's sandbox (a container), started before its servers and released after them; a server with
a runtime of its own gets a sandbox of its own. Workspaces are named at random, not after a
rollout, because a pooled set is created before its rollout is known. Everything a set owns is
written to the ledger before it exists (the workspace) or right after (the server pids), so a
worker that dies leaves nothing a new worker cannot find and free.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymflow.envs.contract import ToolResult, ToolSpec
from gymflow.envs.errors import InfraError, ToolError
from gymflow.envs.mcp.config import McpServerConfig
from gymflow.envs.mcp.content import Parser
from gymflow.envs.mcp.ledger import Ledger
from gymflow.envs.mcp.session import McpSession
from gymflow.envs.runtime.admission import Admission
from gymflow.envs.runtime.base import Sandbox
from gymflow.envs.runtime.config import RuntimeConfig
from gymflow.envs.runtime.forkserver import ForkTarget
from gymflow.envs.runtime.node import NodeRuntimes
from gymflow.envs.runtime.workspace import WorkspaceSeed, seed_workspace


@dataclass
class ServerSet:
    """Started servers of one rollout (or of a pool slot waiting for one)."""

    entry: str
    workspace: Path
    sessions: dict[str, McpSession] = field(default_factory=dict)
    sandboxes: dict[str, Sandbox] = field(default_factory=dict)
    """The rollout's sandboxes: "" for the env's, a server's name for a server's own."""
    routes: dict[str, tuple[McpSession, str]] = field(default_factory=dict)
    """model-facing tool name -> (session, server-side tool name)"""
    shared: bool = False
    """The sessions belong to the env's shared set (`McpEnv.shared_servers`): this set owns only its
    workspace, and stopping it leaves the servers running."""
    restart: Callable[[ServerSet], Awaitable[None]] | None = None
    """Set while the servers are not running (started lazily, or evicted when idle): what starts
    them. The next call starts them, replays `calls` on them, then runs."""
    calls: list[tuple[str, dict[str, Any], str]] | None = None
    """The successful calls (tool, arguments, result text) in order, kept when the env evicts idle
    servers: what rebuilds their state after an eviction."""
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    """Calls in flight (a set is never evicted under one)."""
    _starting: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def alive(self) -> bool:
        """Whether every server is still running."""
        return all(s.alive for s in self.sessions.values())

    async def wait_ended(self) -> None:
        """Return once any of the servers is gone."""
        waits = [asyncio.ensure_future(s.wait_ended()) for s in self.sessions.values()]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def ensure_started(self) -> None:
        """Start the servers of a lazy or evicted set and replay its recorded calls on them.

        Raises:
            InfraError: A server did not start, or a replayed call did not give its recorded result
                (the servers' state could not be rebuilt: never go on with another state).
        """
        if self.restart is None:
            return
        async with self._starting:
            if self.restart is None:
                return
            await self.restart(self)
            self.restart = None
            for index, (tool, arguments, text) in enumerate(self.calls or []):
                session, server_tool = self.routes[tool]
                result = await session.call(server_tool, arguments)
                if result.is_error or result.text != text:
                    raise InfraError(
                        f"the servers were restarted after an idle eviction, and replaying call {index} ({tool}) "
                        f"gave {result.text[:80]!r}, not {text[:80]!r}"
                    )

    async def call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> ToolResult:
        """Call a tool by its model-facing name (`meta`: the request's ``_meta``, for shared servers);
        a set whose servers are not running starts them first (`ensure_started`).

        Raises:
            ToolError: No such tool (the model's mistake).
            InfraError: The server is gone, or could not be started again.
        """
        self.busy += 1
        try:
            await self.ensure_started()
            route = self.routes.get(tool)
            if route is None:
                known = ", ".join(sorted(self.routes)) or "none"
                raise ToolError(f"unknown tool {tool!r}; available tools: {known}")
            session, server_tool = route
            result = await session.call(server_tool, arguments, meta=meta)
        finally:
            self.busy -= 1
            self.last_used = time.monotonic()
        if self.calls is not None and not result.is_error:
            self.calls.append((tool, dict(arguments), result.text))
        return result

    def specs(self) -> list[ToolSpec]:
        """The tools of this set under their model-facing names."""
        specs = []
        for public, (session, server_tool) in self.routes.items():
            spec = next(s for s in session.tool_specs() if s.name == server_tool)
            specs.append(spec.model_copy(update={"name": public}))
        return specs


class ServerSetFactory:
    """Starts and stops ServerSets of one env instance."""

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        *,
        parsers: Mapping[str, dict[str, Parser]],
        workspace_root: Path,
        ledger: Ledger,
        seed: WorkspaceSeed | None = None,
        admission: Admission | None = None,
        runtime: RuntimeConfig | None = None,
        runtimes: Callable[[], NodeRuntimes] | None = None,
    ) -> None:
        self.runtime = runtime
        self.runtimes = runtimes
        """The node's runtimes (asked only when some server runs in a sandbox)."""
        self.servers = dict(servers)
        self.admission = admission or Admission()
        self.parsers = dict(parsers)
        self.workspace_root = workspace_root
        self.ledger = ledger
        self.seed = seed
        self.fork_targets: set[ForkTarget] = set()
        """The programs whose fork servers forked this env's servers (stopped with the env)."""

    async def start(self) -> ServerSet:
        """Create a fresh workspace, seed it, and start every server in it (cwd = workspace).

        Waits for one of the node's start slots first (`gymflow.envs.runtime.admission`), so starts beyond the
        node's capacity queue instead of sharing the cores until every handshake times out; the
        handshake timeout runs from admission.

        Raises:
            InfraError: The seeding or a server failed; whatever was started is stopped again.
        """
        async with self.admission.slot("start"):
            return await self._start()

    async def _start(self) -> ServerSet:
        entry = f"ws-{uuid.uuid4().hex[:12]}"
        workspace = self.workspace_root / entry
        self.ledger.record(entry, workspace=workspace)
        workspace.mkdir(parents=True)
        sset = ServerSet(entry=entry, workspace=workspace)
        try:
            await self._start_sandboxes(sset)
            shared = sset.sandboxes.get("")
            sessions = [
                McpSession(
                    name,
                    cfg,
                    workspace=workspace,
                    parsers=self.parsers.get(name),
                    nice=self.admission.nice,
                    sandbox=sset.sandboxes.get(name, shared) if self._isolated(cfg) else None,
                    sandbox_name=getattr(shared, "name", None),
                )
                for name, cfg in self.servers.items()
            ]
            sset.sessions = {s.name: s for s in sessions}
            if self.seed is not None:  # files and setup before any server sees the workspace
                await seed_workspace(workspace, self.seed)
            # Not gather(*...) without return_exceptions: one failure must not leave siblings starting.
            results = await asyncio.gather(*(s.start() for s in sessions), return_exceptions=True)
            _raise_first(results)
            self.ledger.record(entry, workspace=workspace, pids=[s.pid for s in sessions])
            self.fork_targets.update(t for s in sessions if (t := s.fork_target) is not None)
            sset.routes = _route(sessions)
        except BaseException:
            await self.stop(sset)
            raise
        return sset

    async def attach(self, shared: ServerSet) -> ServerSet:
        """A rollout's set on the env's shared servers: a fresh workspace (seeded, in the ledger) and
        the shared sessions; stopping it removes only the workspace."""
        return await self._seeded_set(sessions=shared.sessions, routes=shared.routes, shared=True)

    async def start_lazy(self, *, record_calls: bool) -> ServerSet:
        """A fresh, seeded workspace whose servers start at its first call (`ServerSet.ensure_started`);
        `record_calls` keeps its calls for replay after an idle eviction (`evict`). Host servers only.

        Raises:
            ValueError: A server runs in a sandbox runtime.
            InfraError: The seeding failed (the workspace is removed again).
        """
        self.refuse_sandboxes("servers started lazily")
        return await self._seeded_set(restart=self._start_servers, calls=[] if record_calls else None)

    def refuse_sandboxes(self, what: str) -> None:
        """Raise ValueError when a server runs in a sandbox runtime (`what` runs servers on the host only)."""
        if self.runtime is not None or any(c.runtime is not None for c in self.servers.values()):
            raise ValueError(f"{what} run on the host, not in a sandbox runtime")

    async def _seeded_set(self, **fields: Any) -> ServerSet:
        """A set with a fresh workspace (in the ledger, seeded) and no servers of its own started."""
        entry = f"ws-{uuid.uuid4().hex[:12]}"
        workspace = self.workspace_root / entry
        self.ledger.record(entry, workspace=workspace)
        workspace.mkdir(parents=True)
        sset = ServerSet(entry=entry, workspace=workspace, **fields)
        if self.seed is not None:
            try:
                await seed_workspace(workspace, self.seed)
            except BaseException:
                await self.stop(sset)
                raise
        return sset

    async def _start_servers(self, sset: ServerSet) -> None:
        """Start a lazy (or evicted) set's servers in its workspace, under a start slot."""
        async with self.admission.slot("start"):
            nice = self.admission.nice
            sessions = [
                McpSession(name, cfg, workspace=sset.workspace, parsers=self.parsers.get(name), nice=nice)
                for name, cfg in self.servers.items()
            ]
            sset.sessions = {s.name: s for s in sessions}
            results = await asyncio.gather(*(s.start() for s in sessions), return_exceptions=True)
            self.ledger.record(sset.entry, workspace=sset.workspace, pids=[s.pid for s in sessions if s.pid])
            try:
                _raise_first(results)
            except BaseException:
                await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
                sset.sessions = {}
                raise
            self.fork_targets.update(t for s in sessions if (t := s.fork_target) is not None)
            sset.routes = _route(sessions)

    async def evict(self, sset: ServerSet) -> None:
        """Stop an idle set's servers; its workspace and recorded calls stay, and its next call starts
        them again and replays the calls (`ServerSet.ensure_started`)."""
        sessions = list(sset.sessions.values())
        sset.sessions, sset.routes, sset.restart = {}, {}, self._start_servers
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        self.ledger.record(sset.entry, workspace=sset.workspace)

    def _isolated(self, config: McpServerConfig) -> bool:
        effective = config.runtime or self.runtime
        return effective is not None and effective.isolated

    async def _start_sandboxes(self, sset: ServerSet) -> None:
        """The env's sandbox (when some server runs in it) and the servers' own, before any server starts."""
        wanted: dict[str, RuntimeConfig] = {}
        for name, config in self.servers.items():
            if config.runtime is not None and config.runtime.isolated:
                wanted[name] = config.runtime
            elif config.runtime is None and self.runtime is not None and self.runtime.isolated:
                wanted[""] = self.runtime
        if self.runtime is not None and self.runtime.isolated:
            wanted[""] = self.runtime  # host-side servers act on it by name (`{sandbox}`)
        if not wanted:
            return
        if self.runtimes is None:
            raise InfraError("this env runs servers in a sandbox, but no runtimes were given to it")
        runtimes = self.runtimes()
        for key, runtime in wanted.items():
            workspace = sset.workspace if key == "" else sset.workspace.with_name(f"{sset.workspace.name}.{key}.ws")
            sset.sandboxes[key] = await runtimes.start(runtime, rollout_id=sset.entry, workspace=workspace)

    async def stop(self, sset: ServerSet) -> None:
        """Stop the servers and sandboxes (not a shared set's: the env's), delete the workspace and its
        logs, drop the ledger entry. Idempotent."""
        if not sset.shared:
            await asyncio.gather(*(s.close() for s in sset.sessions.values()), return_exceptions=True)
        sandboxes = list(sset.sandboxes.values())
        sset.sandboxes = {}
        await asyncio.gather(*(sandbox.release() for sandbox in sandboxes), return_exceptions=True)
        for sandbox in sandboxes:  # a container's workspace path is a link to its (now gone) disk
            if sandbox.workspace.is_symlink():
                sandbox.workspace.unlink(missing_ok=True)
        if sset.workspace.is_symlink():
            sset.workspace.unlink(missing_ok=True)
        shutil.rmtree(sset.workspace, ignore_errors=True)
        for log in sset.workspace.parent.glob(f"{sset.workspace.name}.*.stderr.log"):
            log.unlink(missing_ok=True)
        self.ledger.forget(sset.entry)


def _raise_first(results: Sequence[object]) -> None:
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure


def public_names(tools: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, str]]:
    """Model-facing tool name -> (server, tool) for each server's tools: a tool's own name, or
    `server__tool` where two servers have a tool of that name."""
    counts: dict[str, int] = {}
    for names in tools.values():
        for tool in names:
            counts[tool] = counts.get(tool, 0) + 1
    return {
        (tool if counts[tool] == 1 else f"{server}__{tool}"): (server, tool)
        for server, names in tools.items()
        for tool in names
    }


def _route(sessions: Sequence[McpSession]) -> dict[str, tuple[McpSession, str]]:
    by_name = {session.name: session for session in sessions}
    names = public_names({session.name: [tool.name for tool in session.tools] for session in sessions})
    return {public: (by_name[server], tool) for public, (server, tool) in names.items()}
