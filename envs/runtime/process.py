"""The process runtime: a rollout's commands and servers run as local processes in its workspace.

This is what gymflow did before runtimes existed: no isolation beyond the workspace directory (and
the sheets env's own bubblewrap sandbox). Of `Limits` only the timeouts and output caps hold;
memory, pids, disk and network are not enforced here.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from gymflow.envs.runtime.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    RolloutSpec,
    Runtime,
    Sandbox,
    StdioCommand,
    run_on_host,
)
from gymflow.envs.runtime.transport import server_env
from gymflow.envs.runtime.workspace import resolve_inside


class ProcessSandbox(Sandbox):
    """A workspace directory; commands run in it as local processes in their own session."""

    def __init__(self, spec: RolloutSpec) -> None:
        self.rollout_id = spec.rollout_id
        self.node_id = spec.node_id
        self.workspace = Path(spec.workspace)
        self.workspace_mount = str(self.workspace)
        self.env = dict(spec.env)

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
        return await run_on_host(
            argv,
            cwd=cwd or self.workspace,
            env=server_env({**self.env, **(env or {})}),
            stdin=stdin,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
        )

    def stdio_command(
        self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> StdioCommand:
        return StdioCommand(
            argv=list(argv), env=server_env({**self.env, **(env or {})}), cwd=cwd or str(self.workspace)
        )

    async def copy_in(self, src: Path, dst: str) -> None:
        await asyncio.to_thread(_copy, src, resolve_inside(self.workspace, dst))

    async def copy_out(self, src: str, dst: Path) -> None:
        await asyncio.to_thread(_copy, resolve_inside(self.workspace, src), dst)

    async def release(self) -> None:
        """Nothing to stop: commands end with their calls, servers with their clients."""


class ProcessRuntime(Runtime):
    """Local processes (today's behaviour)."""

    name = "process"

    async def start(self, spec: RolloutSpec) -> ProcessSandbox:
        if spec.image is not None:
            raise ValueError("the process runtime runs no image; use the container runtime")
        await asyncio.to_thread(Path(spec.workspace).mkdir, parents=True, exist_ok=True)
        return ProcessSandbox(spec)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copyfile(src, dst)
