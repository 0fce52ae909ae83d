"""An agent program's process: started in its rollout's sandbox, watched, and killed with everything it started.

The program runs as a local process on the worker's node (its sandbox's `stdio_command`: for the
process runtime, in the rollout's workspace), in a session of its own so that stopping it kills
its whole process group: the shell commands an agent runs included. Three things keep a program
from outliving its rollout:

* `stop` (a cancelled rollout, a budget, the rollout's release) kills the process group;
* ``setpriv --pdeathsig KILL`` (util-linux) makes the kernel kill the program when the worker that
  started it dies, e.g. by ``kill -9``; its own children are left to the next point;
* the pid is written to the env's ledger (gymflow.envs.mcp.ledger) before the program runs, so the
  next worker on the node reaps the whole group of a dead worker's program.

Output (stdout and stderr together) is kept capped, head and tail (`CappedOutput`), for the
trajectory's `ProgramRun.output`; the program's own files are where it writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from gymflow.envs.errors import InfraError
from gymflow.envs.runtime.base import CappedOutput, StdioCommand, drain

PDEATHSIG = ("setpriv", "--pdeathsig", "KILL", "--")
"""Prefix that makes the kernel kill the program when its parent (the worker) dies."""
_STOP_GRACE_S = 2.0


class ProgramError(InfraError):
    """The program could not be started (no such command, not executable)."""


@dataclass(frozen=True)
class ProgramExit:
    """How a program ended."""

    exit_code: int | None
    """Its exit status (128+N for signal N); None when it was stopped."""
    output: str
    duration_s: float


class Program:
    """One running agent program.

    Args:
        command: The host command (a sandbox's `stdio_command`).
        max_output_bytes: Output kept (head and tail halves).
        on_start: Called with the pid as soon as the process exists (the ledger entry).
    """

    def __init__(
        self, command: StdioCommand, *, max_output_bytes: int, on_start: Callable[[int], None] | None = None
    ) -> None:
        self.command = command
        self.output = CappedOutput(max_output_bytes)
        self._on_start = on_start
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._started = 0.0
        self._stopped = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Spawn the program.

        Raises:
            ProgramError: The command does not exist or cannot be executed.
        """
        argv = list(self.command.argv)
        if shutil.which(argv[0], path=self.command.env.get("PATH")) is None:
            raise ProgramError(f"cannot start the agent program: no command {argv[0]!r} (PATH or a file path)")
        prefix = list(PDEATHSIG) if shutil.which(PDEATHSIG[0]) else []
        self._started = time.monotonic()
        try:
            self._process = await asyncio.create_subprocess_exec(
                *prefix,
                *argv,
                cwd=self.command.cwd,
                env=self.command.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ProgramError(f"cannot start the agent program {argv[0]!r}: {exc.strerror or exc}") from exc
        if self._on_start is not None:
            self._on_start(self._process.pid)
        self._reader = asyncio.create_task(drain(self._process.stdout, self.output))

    async def wait(self) -> ProgramExit:
        """Wait for the program to exit (or be stopped)."""
        process = self._process
        if process is None:
            raise RuntimeError("the program was not started")
        code = await process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        status = None if self._stopped else (128 - code if code < 0 else code)
        return ProgramExit(exit_code=status, output=self.output.text(), duration_s=time.monotonic() - self._started)

    async def stop(self) -> None:
        """Kill the program's process group: SIGTERM, then SIGKILL after a grace period. Idempotent."""
        process = self._process
        if process is None or process.returncode is not None:
            self._kill_group(signal.SIGKILL)  # children it left behind
            return
        self._stopped = True
        self._kill_group(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
        self._kill_group(signal.SIGKILL)
        await process.wait()

    def _kill_group(self, sig: signal.Signals) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, sig)
