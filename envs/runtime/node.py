"""A worker node's runtimes: the process runtime, and a container runtime made when an env first needs one.

One `NodeRuntimes` per worker process, shared by every env instance it holds (handed to envs as the
`runtimes` keyword, like the node's admission control). The container runtime is built lazily, so a
worker whose envs run only local processes never touches an engine; it is closed at worker exit,
and `reap` (called by the worker's reaper every round) removes what dead workers on this host left.

`unavailable_container()` tells an env, cheaply, whether this node can run containers at all, and
what to install when it cannot.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from pathlib import Path

from gymflow.envs.contract import Unavailable
from gymflow.envs.runtime.base import RolloutSpec, Runtime, Sandbox
from gymflow.envs.runtime.bwrap import BwrapRuntime, unavailable_bwrap
from gymflow.envs.runtime.config import RuntimeConfig
from gymflow.envs.runtime.container import ContainerRuntime
from gymflow.envs.runtime.diskwatch import node_guarantee
from gymflow.envs.runtime.engine import INSTALL_HINT, Engine, EngineUnavailable
from gymflow.envs.runtime.images import build_image
from gymflow.envs.runtime.owners import OWNERS_DIR
from gymflow.envs.runtime.process import ProcessRuntime
from gymflow.envs.runtime.reaper import reap_host

log = logging.getLogger(__name__)

DEFAULT_STATE_ROOT = Path("/var/tmp/gymflow-runtime")
"""Where container disks and lock files live (not /tmp: it may be a small tmpfs)."""


def unavailable_runtime(kind: str) -> Unavailable | None:
    """Why this node cannot run sandboxes of `kind` (with the fix), or None."""
    if kind == "container":
        return unavailable_container()
    return unavailable_bwrap() if kind == "bwrap" else None


def unavailable_container() -> Unavailable | None:
    """Why this node cannot run rollout containers (with the install command), or None."""
    try:
        Engine.detect()
    except EngineUnavailable as exc:
        return Unavailable(str(exc).removeprefix("no container engine: "), INSTALL_HINT)
    missing = [tool for tool in ("mkfs.ext4", "mount") if shutil.which(tool) is None]
    if missing:
        return Unavailable(f"{', '.join(missing)} is missing (container disks are ext4 images)", INSTALL_HINT)
    return None


def container_facts() -> list[str]:
    """What this node's container runtime is and what it promises about disk caps (for `envs show`)."""
    try:
        engine = Engine.detect()
    except EngineUnavailable as exc:
        return [f"containers: {exc}"]
    guarantee = node_guarantee(engine)
    return [f"container engine: {engine.kind} ({engine.binary})", f"disk cap: {guarantee.describe()}"]


class NodeRuntimes:
    """The runtimes of one worker node."""

    def __init__(self, *, node_id: str, state_root: Path = DEFAULT_STATE_ROOT, pool_size: int = 0) -> None:
        self.node_id = node_id
        self.state_root = state_root
        self.pool_size = pool_size
        self.process = ProcessRuntime()
        self.bwrap = BwrapRuntime()
        self.container: ContainerRuntime | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def local(cls) -> NodeRuntimes:
        """Runtimes of a process that is no worker (an env built directly, a test): a node id of its own."""
        return cls(node_id=f"local-{uuid.uuid4().hex[:8]}")

    async def containers(self) -> ContainerRuntime:
        """The node's container runtime, made on first use.

        Raises:
            EngineUnavailable: No engine on the node (the message names the install command).
        """
        async with self._lock:
            if self._closed:
                raise RuntimeError("the node's runtimes are closed")
            if self.container is None:
                self.container = ContainerRuntime(
                    node_id=self.node_id, state_root=self.state_root, pool_size=self.pool_size
                )
                engine = self.container.engine
                guarantee = await asyncio.to_thread(node_guarantee, engine)
                log.info("container runtime on node %s: %s (%s); disk cap %s", self.node_id, engine.kind,
                         engine.binary, guarantee.describe())  # fmt: skip
            return self.container

    async def runtime(self, config: RuntimeConfig) -> Runtime:
        """The runtime `config` names."""
        if config.kind == "container":
            return await self.containers()
        return self.bwrap if config.kind == "bwrap" else self.process

    async def image(self, config: RuntimeConfig, *, base_dir: Path | None = None) -> str | None:
        """The image `config` runs: its `image`, or its `build` context built once per node."""
        if config.build is None:
            return config.image
        runtime = await self.containers()
        context = Path(config.build) if base_dir is None else base_dir / config.build
        return await build_image(
            runtime.engine,
            name=context.name,
            context=context,
            timeout_s=config.build_timeout_s,
            state_dir=runtime.state_root,  # host-wide: sibling worker processes build an image once
        )

    async def start(self, config: RuntimeConfig, *, rollout_id: str, workspace: Path) -> Sandbox:
        """A started sandbox for one rollout under `config` (the workspace must be an empty directory)."""
        runtime = await self.runtime(config)
        spec = RolloutSpec(
            rollout_id=rollout_id,
            node_id=self.node_id,
            workspace=str(workspace),
            limits=config.limits,
            image=await self.image(config),
            workdir=config.workdir,
            env=config.env,
            workspace_mount=config.workspace_mount if config.kind == "container" else str(workspace),
        )
        return await runtime.start(spec)

    async def reap(self) -> list[str]:
        """Remove this host's orphaned containers (dead workers', and any this node leaked).

        A host where no container runtime ever ran (no owners directory) costs nothing.
        """
        if self.container is None and not (self.state_root / OWNERS_DIR).is_dir():
            return []
        try:
            engine = self.container.engine if self.container is not None else Engine.detect()
        except EngineUnavailable:
            return []
        return await reap_host(engine, state_root=self.state_root, runtime=self.container)

    async def close(self) -> None:
        """Close the container runtime (its warm pool); rollouts' sandboxes are released by their envs first."""
        async with self._lock:
            self._closed = True
            runtime, self.container = self.container, None
        if runtime is not None:
            await runtime.close()
