"""The container runtime: one container per rollout (podman or docker), from a warm pool where one is ready.

A rollout's container:

* has its writes capped at `storage_mb`, as hard as its engine allows (gymflow.envs.runtime.diskwatch
  states the guarantee): under podman it runs on a root of its own whose writes land on a
  loop-mounted ext4 (gymflow.envs.runtime.disk explains why: no quota support on these nodes);
  under docker, which has no `--rootfs`, it runs the image itself, its workspace on that ext4 and its
  writable layer capped by `--storage-opt size` where the daemon takes it, else watched;
* has `--cpus`, `--memory` (= `--memory-swap`: no swap), `--pids-limit` and matching
  `--ulimit nproc`, `no-new-privileges`, and `--network none` unless `Limits.network` (the
  engine's default network) or `Limits.network_allow` (that network, egress only to the listed
  destinations: gymflow.envs.runtime.egress loads the rules before the container is handed out);
* mounts nothing from the host but the rollout's workspace (`RolloutSpec.workspace_mount`), which
  lives on the capped filesystem; the host path the caller names becomes a symlink to it;
* keeps a `sleep infinity` under the engine's init (catatonit, docker-init: they reap what commands
  leave behind); every command is an `exec`, run as a new session whose process group a timeout kills;
* carries labels: the gymflow marker, the node, the rollout (cold starts), the runtime instance
  that made it and its state directory. A warm-pool container is made before its rollout is known
  and labels cannot change, so taking one writes the rollout id to `<state>/rollout`, which the
  reaper reads (gymflow.envs.runtime.reaper).

The warm pool keeps `pool_size` started containers per (image, limits, workdir, env, mount); a
taken container is replaced in the background and never given to a second rollout: release
removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from gymflow.envs.errors import SandboxError
from gymflow.envs.runtime import egress, owners
from gymflow.envs.runtime.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    RolloutSpec,
    Runtime,
    Sandbox,
    StdioCommand,
)
from gymflow.envs.runtime.cexec import ContainerExec, cgroup_of_pid
from gymflow.envs.runtime.disk import RolloutDisk
from gymflow.envs.runtime.diskwatch import DiskCapUnavailable, DiskGuarantee, DiskWatch, probe_storage_opt
from gymflow.envs.runtime.engine import Engine, client_dir, label_flags, limit_flags, rollout_labels
from gymflow.envs.runtime.services import ServiceGroup
from gymflow.envs.runtime.transport import server_env
from gymflow.envs.runtime.workspace import check_workspace, link_workspace

log = logging.getLogger(__name__)

ROLLOUT_FILE = "rollout"
"""In a container's state directory: the id of the rollout that took it from the pool."""
KEEPALIVE = ("sleep", "infinity")
START_TIMEOUT_S = 120.0


class ContainerSandbox(Sandbox):
    """A rollout's container."""

    def __init__(
        self, runtime: ContainerRuntime, *, name: str, disk: RolloutDisk, workdir: str, mount: str, cgroup: str
    ) -> None:
        self.runtime = runtime
        self.engine = runtime.engine
        self.name = name
        self.disk = disk
        self.workdir = workdir
        self.workspace_mount = mount
        self.executor = ContainerExec(runtime.engine, name, workdir=workdir, cgroup=cgroup)
        self.rollout_id = ""
        self.node_id = runtime.node_id
        self.workspace = disk.workspace
        self.services: ServiceGroup | None = None
        """The compose file's other services, on the rollout's network (removed after the container)."""
        self.watch: DiskWatch | None = None
        self.disk_exceeded = ""
        """Set when the disk watch killed the container: what every later command reports."""
        self._released = False

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        if self._released:
            raise SandboxError(f"container {self.name} was released")
        if self.disk_exceeded:
            return ExecResult(exit_code=None, stderr=self.disk_exceeded, disk_exceeded=True)
        result = await self.executor.exec(
            argv, stdin=stdin, timeout_s=timeout_s, max_output_bytes=max_output_bytes, cwd=cwd, env=env
        )
        if self.disk_exceeded:  # killed under the command
            return result.model_copy(update={"disk_exceeded": True, "stderr": result.stderr + self.disk_exceeded})
        # A command killed by a signal (137: the container's init was killed with it) or an engine
        # failure: tell a dead container from a command that died, so no result of a dead container
        # reads as the command's.
        if (result.exit_code is None or result.exit_code >= 125) and not await self.running():
            raise SandboxError(f"container {self.name} stopped (killed or removed outside gymflow)")
        return result

    async def running(self) -> bool:
        """Whether the container still runs."""
        done = await self.engine.run(["inspect", "--format", "{{.State.Running}}", self.name], check=False)
        return done.returncode == 0 and done.stdout.strip() == "true"

    def stdio_command(
        self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> StdioCommand:
        full = self.engine.exec_argv(
            self.name, list(argv), interactive=True, workdir=cwd or self.workdir, env=dict(env or {})
        )
        return StdioCommand(argv=full, env=server_env(None), cwd=str(client_dir()))

    async def copy_in(self, src: Path, dst: str) -> None:
        is_dir = source_kind(src)
        target = dst.rstrip("/") or "/"
        parent = target if is_dir else os.path.dirname(target) or "/"
        await self._checked_exec(["mkdir", "-p", "--", parent])
        source = f"{src}/." if is_dir else str(src)
        await self.engine.run(["cp", source, f"{self.name}:{target}"], timeout_s=300)

    async def copy_out(self, src: str, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        await self.engine.run(["cp", f"{self.name}:{src}", str(dst)], timeout_s=300)

    async def _checked_exec(self, argv: list[str]) -> None:
        done = await self.exec(argv, timeout_s=60)
        if not done.ok:
            raise SandboxError(f"`{' '.join(argv)}` failed in {self.name}: {done.stderr.strip()[-500:]}")

    async def exceeded(self, used: int) -> None:
        """The disk watch found the container's writes past its cap: kill it, and say so from now on."""
        cap = self.runtime.storage_mb.get(self.name, 0)
        self.disk_exceeded = (
            f"[the container's writes reached {used / 2**20:.0f} MB, past its disk cap of {cap} MB: "
            "it was stopped, and nothing more runs in it]"
        )
        log.warning("container %s of rollout %s passed its disk cap: killed", self.name, self.rollout_id)
        await self.engine.run(["kill", self.name], check=False, timeout_s=30)

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.watch is not None:
            await self.watch.stop()
        await self.engine.remove([self.name])
        if self.services is not None:  # after the container: its network cannot go while it is attached
            await self.services.close()
        await self.disk.destroy()
        self.runtime.forget(self)


PoolKey = tuple[str, str, str, str, str]


class ContainerRuntime(Runtime):
    """Starts rollout containers on one node (rootful podman)."""

    name = "container"

    def __init__(
        self,
        *,
        node_id: str,
        state_root: Path,
        engine: Engine | None = None,
        pool_size: int = 0,
        keepalive: Sequence[str] = KEEPALIVE,
    ) -> None:
        self.engine = engine or Engine.detect()
        self.node_id = node_id
        self.state_root = state_root
        self.state_dir = state_root / node_id
        self.pool_size = pool_size
        self.keepalive = list(keepalive)
        self.owner = uuid.uuid4().hex[:16]
        """This runtime instance, in the `gymflow.owner` label of what it starts."""
        self._owner_fd = owners.hold(state_root, self.owner)  # reapers on this host see it alive
        self._image_roots: dict[str, tuple[str, dict[str, object]]] = {}
        self._image_lock = asyncio.Lock()
        self._pools: dict[PoolKey, list[ContainerSandbox]] = {}
        self._filling: dict[PoolKey, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: dict[str, ContainerSandbox] = {}
        self.storage_mb: dict[str, int] = {}
        """Each live container's cap, for the messages of the disk watch."""
        self._guarantee: DiskGuarantee | None = DiskGuarantee.HARD_ROOT if self.engine.kind == "podman" else None
        self._closed = False

    async def start(self, spec: RolloutSpec) -> ContainerSandbox:
        if spec.node_id != self.node_id:
            raise ValueError(f"this runtime serves node {self.node_id!r}, not {spec.node_id!r}")
        if spec.image is None:
            raise ValueError("the container runtime needs an image")
        workspace = Path(spec.workspace)
        if not workspace.is_absolute():
            raise ValueError(f"the workspace must be an absolute path, got {spec.workspace!r}")
        check_workspace(workspace)
        if spec.limits.storage_hard and not (guarantee := await self.disk_guarantee(spec.image)).hard:
            raise DiskCapUnavailable(
                f"the task needs writes to fail at its disk cap (storage_hard) and this node's {self.engine.kind} "
                f"gives only {guarantee.describe()}; run it on a podman node or a docker on XFS with project quotas"
            )
        if spec.services is not None and (spec.limits.network or spec.limits.network_allow):
            raise ValueError("a rollout with services runs on its own network: network/network_allow do not apply")
        key = pool_key(spec)
        ready = self._pools.get(key, []) if spec.services is None else []
        sandbox = ready.pop(0) if ready else None
        if sandbox is not None:
            (sandbox.disk.path / ROLLOUT_FILE).write_text(spec.rollout_id)
        else:
            sandbox = await self._create(spec, rollout_id=spec.rollout_id)
        if spec.services is None:  # a rollout network is the rollout's own: no warm pool for those
            self._refill(spec)
        sandbox.rollout_id = spec.rollout_id
        link_workspace(workspace, sandbox.disk.workspace)
        sandbox.workspace = workspace
        return sandbox

    async def warm(self, spec: RolloutSpec, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Fill the pool of `spec`'s kind of container (its rollout id and workspace are ignored)."""
        key = pool_key(spec)
        self._refill(spec)
        deadline = time.monotonic() + timeout_s
        while len(self._pools.get(key, [])) < self.pool_size:
            if not self._filling.get(key):
                raise SandboxError(f"the warm pool could not start containers of {spec.image}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"warm pool not full after {timeout_s:g}s")
            await asyncio.wait(
                set(self._tasks), timeout=max(0.0, deadline - time.monotonic()), return_when="FIRST_COMPLETED"
            )

    async def disk_guarantee(self, image: str) -> DiskGuarantee:
        """What this node promises about disk caps (docker: tried once, with a container created from `image`
        and never started)."""
        if self._guarantee is None:
            async with self._image_lock:
                if self._guarantee is None:
                    self._guarantee = await probe_storage_opt(self.engine, image)
        return self._guarantee

    def ready(self, spec: RolloutSpec) -> int:
        """Started containers waiting for rollouts like `spec`."""
        return len(self._pools.get(pool_key(spec), []))

    async def close(self) -> None:
        """Stop refilling, remove pooled containers and unmount images; live sandboxes are the callers'."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        pooled = [s for ready in self._pools.values() for s in ready]
        self._pools.clear()
        await asyncio.gather(*(s.release() for s in pooled), return_exceptions=True)
        if not self._live:
            for image in list(self._image_roots):
                await self.engine.run(["image", "unmount", image], check=False)
            self._image_roots.clear()
            if self._owner_fd >= 0:
                owners.release(self.state_root, self.owner, self._owner_fd)
                self._owner_fd = -1
            with contextlib.suppress(OSError):  # the node's directory, once its last disk is gone
                self.state_dir.rmdir()

    def live(self) -> list[str]:
        """Names of the containers this runtime started and nobody released yet (pooled ones included)."""
        return list(self._live)

    def forget(self, sandbox: ContainerSandbox) -> None:
        self._live.pop(sandbox.name, None)
        self.storage_mb.pop(sandbox.name, None)

    def _refill(self, spec: RolloutSpec) -> None:
        key = pool_key(spec)
        missing = self.pool_size - len(self._pools.setdefault(key, [])) - self._filling.get(key, 0)
        for _ in range(0 if self._closed else missing):
            self._filling[key] = self._filling.get(key, 0) + 1
            task = asyncio.ensure_future(self._fill_one(key, spec))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fill_one(self, key: PoolKey, spec: RolloutSpec) -> None:
        try:
            sandbox = await self._create(spec, rollout_id="")
        except Exception as exc:  # a refill failure must not kill the pool; a cold start reports it
            log.warning("warm pool could not start a container of %s: %s", spec.image, exc)
            return
        finally:
            self._filling[key] -= 1
        if self._closed:
            await sandbox.release()
        else:
            self._pools[key].append(sandbox)

    async def _create(self, spec: RolloutSpec, *, rollout_id: str) -> ContainerSandbox:
        assert spec.image is not None
        podman = self.engine.kind == "podman"
        lower, config = await self._image(spec.image)
        guarantee = await self.disk_guarantee(spec.image)
        name = f"gymflow-{uuid.uuid4().hex[:12]}"
        disk = RolloutDisk(self.state_dir / name)
        await disk.create(lower=lower if podman else None, size_mb=spec.limits.storage_mb, owner=self.owner)
        workdir = spec.workdir or str(config.get("WorkingDir") or "") or "/"
        group = None
        try:
            args = ["run", "-d", "--name", name, *self.engine.run_flags(), "--init"]
            labels = rollout_labels(self.node_id, rollout_id, self.owner, str(disk.path))
            args += label_flags(labels)
            args += limit_flags(spec.limits, joins_network=spec.services is not None)
            if spec.services is not None:
                group = ServiceGroup(self.engine, spec.services, labels=labels, state_dir=self.state_root)
                await group.start()
                args += group.main_flags()
            args += ["--security-opt", "no-new-privileges", "--hostname", "sandbox", "--workdir", workdir]
            args += ["-v", f"{disk.workspace}:{spec.workspace_mount}"]
            allowed = await egress.resolve(spec.limits.network_allow) if spec.limits.network_allow else None
            args += egress.host_flags(allowed or [])
            args += env_flags(config, spec.env)
            await self.engine.run([*args, *self._root_args(spec, disk, workdir, guarantee)], timeout_s=START_TIMEOUT_S)
            fmt = "{{.State.Pid}} {{.GraphDriver.Data.UpperDir}}"
            state = await self.engine.run(["inspect", "--format", fmt, name])
            pid_text, _, upper = state.stdout.strip().partition(" ")
            pid = int(pid_text)
            cgroup = await self._cgroup(name, pid)
            if allowed is not None:  # before anything runs in it but its keepalive
                await egress.apply(pid, allowed)
            if group is not None:  # the same: only its own network, not the host nor other rollouts
                await group.isolate(pid)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._discard(name, disk, group))
            raise
        sandbox = ContainerSandbox(
            self, name=name, disk=disk, workdir=workdir, mount=spec.workspace_mount, cgroup=cgroup
        )
        sandbox.services = group
        if guarantee is DiskGuarantee.WATCHED:
            cap = spec.limits.storage_mb * 2**20
            sandbox.watch = DiskWatch(
                layer=Path(upper), workspace_used=disk.used_bytes, cap_bytes=cap, on_exceeded=sandbox.exceeded
            )
            sandbox.watch.start()
        self._live[name] = sandbox
        self.storage_mb[name] = spec.limits.storage_mb
        return sandbox

    def _root_args(self, spec: RolloutSpec, disk: RolloutDisk, workdir: str, guarantee: DiskGuarantee) -> list[str]:
        """The end of the `run` argv: the root (podman: the capped overlay; docker: the image), then the keepalive."""
        assert spec.image is not None
        if self.engine.kind == "podman":
            (disk.root / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)  # --rootfs does not create it
            # `--rootfs` is a switch: the root's path is the first positional argument, then the command.
            return ["--rootfs", str(disk.root), *self.keepalive]
        size = ["--storage-opt", f"size={spec.limits.storage_mb}m"] if guarantee is DiskGuarantee.HARD_LAYER else []
        return [*size, "--entrypoint", self.keepalive[0], spec.image, *self.keepalive[1:]]

    async def _cgroup(self, name: str, pid: int) -> str:
        """The container's cgroup path (podman reports it; for docker, its first process's memory cgroup)."""
        if self.engine.kind == "podman":
            return (await self.engine.run(["inspect", "--format", "{{.State.CgroupPath}}", name])).stdout.strip()
        return cgroup_of_pid(pid)

    async def _discard(self, name: str, disk: RolloutDisk, group: ServiceGroup | None = None) -> None:
        await self.engine.remove([name])
        if group is not None:
            await group.close()
        await disk.destroy()

    async def _image(self, image: str) -> tuple[str, dict[str, object]]:
        """The image's mounted root (podman: the overlay's lower layer, mounted once per runtime; docker: "")
        and its config."""
        async with self._image_lock:
            if image not in self._image_roots:
                config = await self.engine.image_config(image)
                root = ""
                if self.engine.kind == "podman":
                    root = (await self.engine.run(["image", "mount", image])).stdout.strip()
                self._image_roots[image] = (root, config)
        return self._image_roots[image]


def source_kind(src: Path) -> bool:
    """Whether `src` is a directory (raises SandboxError when it does not exist)."""
    if not src.exists():
        raise SandboxError(f"nothing to copy at {src}")
    return src.is_dir()


def pool_key(spec: RolloutSpec) -> PoolKey:
    env = json.dumps(spec.env, sort_keys=True)
    return (spec.image or "", spec.limits.model_dump_json(), spec.workdir or "", env, spec.workspace_mount)


def env_flags(config: Mapping[str, object], env: Mapping[str, str]) -> list[str]:
    """`--env` flags: the image's own environment (a `--rootfs` run does not read it), then the spec's."""
    listed = config.get("Env")
    image_env = [e for e in listed if isinstance(e, str)] if isinstance(listed, list) else []
    return [arg for item in [*image_env, *(f"{k}={v}" for k, v in env.items())] for arg in ("--env", item)]
