"""The bwrap runtime: a rollout's commands and servers in a bubblewrap sandbox on the worker's own root.

The sheets env's code sandbox (gymflow.envs.builtin.sheets.sandbox) generalised behind the `Runtime`
interface, for envs whose tools are programs already on the worker (no image to build) but that must
not see the host: each command or server runs under `bwrap` with

* new pid, net, ipc and uts namespaces (no network at all: not even the host's loopback);
* the system's /usr and the interpreter read-only, a private /tmp, and the rollout's workspace
  read-write at `/workspace`: nothing else of the host's files;
* as root, a uid of its own per rollout (`setpriv`, no capabilities, no_new_privs), the workspace
  owned by it, so one rollout cannot touch another's files or processes;
* `prlimit` resource limits from `Limits`: address space (`memory_mb`), processes (`pids`), open
  files; disk is the workspace's quota (the env's, gymflow.envs.runtime.workspace), not enforced here.

It shares the sheets sandbox's command-line plumbing (gymflow.envs.runtime.confine) rather
than copying it. Unlike the container runtime it runs no image: `RolloutSpec.image` is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from gymflow.envs.contract import Unavailable
from gymflow.envs.errors import SandboxError
from gymflow.envs.runtime import confine
from gymflow.envs.runtime.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    Limits,
    RolloutSpec,
    Runtime,
    Sandbox,
    StdioCommand,
    run_on_host,
)
from gymflow.envs.runtime.transport import server_env
from gymflow.envs.runtime.workspace import resolve_inside

UID_BASE = 1_200_000
"""Sandbox uids (as root) are UID_BASE + a hash of the rollout id: far above any real user."""
UID_RANGE = 100_000


def unavailable_bwrap() -> Unavailable | None:
    """Why this node cannot run bwrap sandboxes (with the fix), or None."""
    try:
        confine.bwrap_binary()
        confine.which("prlimit")
    except confine.SandboxUnavailable as exc:
        return Unavailable(str(exc), "apt-get install bubblewrap util-linux")
    return None


class BwrapSandbox(Sandbox):
    """A workspace directory; every command runs under bwrap with it as /workspace."""

    shares_host_root = True

    def __init__(self, spec: RolloutSpec) -> None:
        self.rollout_id = spec.rollout_id
        self.node_id = spec.node_id
        self.workspace = Path(spec.workspace)
        self.workspace_mount = confine.SANDBOX_DIR
        self.name = f"bwrap-{spec.rollout_id}"
        self.env = dict(spec.env)
        self.limits = spec.limits
        self.root = os.geteuid() == 0
        self.uid = UID_BASE + int(hashlib.sha256(spec.rollout_id.encode()).hexdigest(), 16) % UID_RANGE
        self.workdir = spec.workdir or confine.SANDBOX_DIR

    def wrap(self, argv: Sequence[str], *, cwd: str | None = None) -> list[str]:
        """The host argv running `argv` in this sandbox."""
        lim = confine.Limits(
            cpu_s=24 * 3600,  # commands are bounded by their wall-clock timeout, not CPU seconds
            memory_mb=self.limits.memory_mb,
            processes=self.limits.pids,
            open_files=self.limits.nofile,
            file_mb=self.limits.storage_mb,
        )
        args = confine.bwrap_args(self.workspace, lim, root=self.root)[:-1]
        tmp = args.index("/tmp", args.index("--tmpfs")) + 1
        # The system's programs too (a shell, coreutils): a tool sandbox runs more than an interpreter.
        args[tmp:tmp] = ["--ro-bind", "/usr", "/usr"]
        chdir = args.index("--chdir")
        args[chdir + 1] = cwd or self.workdir
        drop = confine.setpriv_args(self.uid) if self.root else []
        # prlimit outside: the limits hold for everything bwrap starts (the sandbox has no prlimit).
        return [*confine.prlimit_args(lim, uid=self.uid if self.root else None), *args, "--", *drop, *argv]

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
        try:
            full = self.wrap(argv, cwd=cwd)
        except confine.SandboxUnavailable as exc:
            raise SandboxError(str(exc)) from exc
        return await run_on_host(
            full,
            cwd=None,
            env=server_env({**self.env, **(env or {})}),
            stdin=stdin,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
        )

    def stdio_command(
        self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> StdioCommand:
        return StdioCommand(
            argv=self.wrap(argv, cwd=cwd), env=server_env({**self.env, **(env or {})}), cwd=str(self.workspace)
        )

    async def copy_in(self, src: Path, dst: str) -> None:
        await asyncio.to_thread(
            _copy, src, resolve_inside(self.workspace, _relative(dst)), self.uid if self.root else None
        )

    async def copy_out(self, src: str, dst: Path) -> None:
        await asyncio.to_thread(_copy, resolve_inside(self.workspace, _relative(src)), dst, None)

    async def release(self) -> None:
        """Stop whatever still runs as the sandbox's uid (servers end with their clients)."""
        if self.root:
            await asyncio.to_thread(confine.kill_uid, self.uid)


class BwrapRuntime(Runtime):
    """bubblewrap sandboxes on the worker's own root filesystem."""

    name = "bwrap"

    async def start(self, spec: RolloutSpec) -> BwrapSandbox:
        if spec.image is not None:
            raise ValueError("the bwrap runtime runs no image; use the container runtime")
        problem = unavailable_bwrap()
        if problem is not None:
            raise SandboxError(str(problem))
        workspace = Path(spec.workspace)
        await asyncio.to_thread(workspace.mkdir, parents=True, exist_ok=True)
        sandbox = BwrapSandbox(spec)
        if sandbox.root:
            await asyncio.to_thread(confine.claim, workspace, sandbox.uid)
        return sandbox


def _relative(path: str) -> str:
    """A sandbox path (`/workspace/x` or `x`) as a path relative to the workspace."""
    if path == confine.SANDBOX_DIR or path.startswith(confine.SANDBOX_DIR + "/"):
        return path[len(confine.SANDBOX_DIR) :].lstrip("/") or "."
    if path.startswith("/"):
        raise SandboxError(f"only the workspace ({confine.SANDBOX_DIR}) is writable in a bwrap sandbox, not {path}")
    return path


def _copy(src: Path, dst: Path, uid: int | None) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copyfile(src, dst)
    if uid is not None:
        for path in [dst, *(dst.rglob("*") if dst.is_dir() else [])]:
            os.lchown(path, uid, uid)


__all__ = ["BwrapRuntime", "BwrapSandbox", "Limits", "unavailable_bwrap"]
