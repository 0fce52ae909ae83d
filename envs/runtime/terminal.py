"""The terminal toolset: `bash`, `read_file`, `write_file`, `list_dir` acting inside one rollout's sandbox.

Run it over stdio bound to a container with
``python -m gymflow.envs.runtime.terminal --container NAME [--engine podman] [--workdir /app]``;
tests use `build_server(sandbox)` in memory (``mcp.Client(server)``).

Design decisions:

* The server runs on the host and acts through the engine (`podman exec`), not inside the
  container: task images need no Python (most Harbor images have none), and the limits the model
  must not get around (time limits, output caps) are enforced outside its reach. The cost is one
  engine call per tool call (bench/containers.py measures it).
* Commands run in the sandbox's working directory (`/app` for Harbor tasks); relative paths in every
  tool resolve there. Each `bash` call is a fresh `bash -c` (sh where the image has no bash): state
  lives in the filesystem, not in a shell session, so a call replayed after a crash means the same.
* A timeout kills the command and everything in its process group, and the result says so.
  Processes the command put in the background with their output redirected keep running (a service
  the task asks for). Output beyond `MAX_OUTPUT_BYTES` per stream keeps its start and end with a note.
* Failures the model should read are `ToolError`s: a timeout, a command killed for memory, a file
  that does not exist. A non-zero exit status is not an error: the model reads the status line.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Protocol

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from gymflow.envs.runtime.base import ExecResult

MAX_OUTPUT_BYTES = 16 * 1024
"""Output of one stream of one call kept for the model (start and end)."""
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 1800.0
MAX_FILE_BYTES = 256 * 1024
"""Largest file `read_file` returns whole (larger ones are cut with a note)."""
_SHELL = 'command -v bash >/dev/null 2>&1 && exec bash -c "$1"; exec sh -c "$1"'


class Executor(Protocol):
    """What the tools need of a sandbox: `Sandbox.exec`."""

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float,
        max_output_bytes: int = ...,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult: ...


def build_server(sandbox: Executor, *, memory_mb: int | None = None) -> MCPServer:
    """The terminal tools bound to `sandbox` (`memory_mb` only words the out-of-memory message)."""
    server = MCPServer(
        "terminal",
        instructions=(
            "A Linux machine. `bash` runs a shell command in the working directory and returns its output and "
            "exit status; `read_file`, `write_file` and `list_dir` work on files. Each command runs in a fresh "
            "shell: use files, not shell variables, to keep state between calls."
        ),
    )

    @server.tool()
    async def bash(command: str, timeout: float = DEFAULT_TIMEOUT_S) -> str:  # noqa: ASYNC109 - the tool's argument
        """Run a shell command (bash -c) in the working directory.

        Args:
            command: The command line.
            timeout: Seconds before the command is killed (at most 1800).
        """
        if not command.strip():
            raise ToolError("an empty command")
        limit = min(max(timeout, 1.0), MAX_TIMEOUT_S)
        result = await sandbox.exec(
            ["sh", "-c", _SHELL, "sh", command], timeout_s=limit, max_output_bytes=MAX_OUTPUT_BYTES
        )
        return report(result, limit, memory_mb)

    @server.tool()
    async def read_file(path: str) -> str:
        """Read a text file.

        Args:
            path: The file (relative to the working directory, or absolute).
        """
        result = await sandbox.exec(["cat", "--", path], timeout_s=30, max_output_bytes=MAX_FILE_BYTES)
        if result.exit_code != 0:
            raise ToolError(result.stderr.strip() or f"cannot read {path!r}")
        note = (
            f"\n[file cut: only its first and last {MAX_FILE_BYTES // 2} bytes are shown]" if result.truncated else ""
        )
        return result.stdout + note

    @server.tool()
    async def write_file(path: str, content: str) -> str:
        """Create or overwrite a file with `content` (parent directories are created).

        Args:
            path: The file (relative to the working directory, or absolute).
            content: The whole new content.
        """
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        data = content.encode()
        result = await sandbox.exec(["sh", "-c", script, "sh", path], stdin=data, timeout_s=30)
        if result.exit_code != 0:
            raise ToolError(result.stderr.strip() or f"cannot write {path!r}")
        return f"wrote {len(data)} bytes to {path}"

    @server.tool()
    async def list_dir(path: str = ".") -> str:
        """List a directory (ls -la).

        Args:
            path: The directory (relative to the working directory, or absolute).
        """
        result = await sandbox.exec(["ls", "-la", "--", path], timeout_s=30, max_output_bytes=MAX_OUTPUT_BYTES)
        if result.exit_code != 0:
            raise ToolError(result.stderr.strip() or f"cannot list {path!r}")
        return result.stdout

    return server


def report(result: ExecResult, timeout_s: float, memory_mb: int | None) -> str:
    output = result.stdout
    if result.stderr:
        output += ("\n" if output and not output.endswith("\n") else "") + result.stderr
    if result.truncated:
        output += f"\n[output truncated: only the first and last {MAX_OUTPUT_BYTES // 2} bytes of a stream are shown]"
    if result.timed_out:
        raise ToolError(f"{output}\n[the command timed out after {timeout_s:g}s and was killed]".lstrip())
    if result.disk_exceeded:
        raise ToolError(f"{output}\n[the sandbox was stopped: its writes passed the disk cap]".lstrip())
    if result.oom_killed:
        limit = f" ({memory_mb} MB)" if memory_mb else ""
        raise ToolError(
            f"{output}\n[a process was killed: out of memory{limit}; exit status {result.exit_code}]".lstrip()
        )
    return f"{output}\n[exit status {result.exit_code}]".lstrip()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the terminal tools over stdio for one container."""
    from gymflow.envs.runtime.cexec import ContainerExec
    from gymflow.envs.runtime.engine import Engine

    parser = argparse.ArgumentParser(description="gymflow's terminal MCP server, bound to one container")
    parser.add_argument("--container", required=True, help="the container's name or id")
    parser.add_argument("--engine", default=None, help="podman or docker (default: detected)")
    parser.add_argument("--workdir", default=None, help="working directory inside the container")
    parser.add_argument("--memory-mb", type=int, default=None, help="the container's memory limit (for messages)")
    parser.add_argument("--cgroup", default="", help="the container's cgroup path (OOM detection)")
    args = parser.parse_args(argv)
    executor = ContainerExec(Engine.detect(args.engine), args.container, workdir=args.workdir, cgroup=args.cgroup)
    build_server(executor, memory_mb=args.memory_mb).run()


def server_args(container: str, *, workdir: str | None, memory_mb: int | None, cgroup: str = "") -> list[str]:
    """The `python -m gymflow.envs.runtime.terminal ...` arguments (after the interpreter) for one container."""
    args = ["-m", "gymflow.envs.runtime.terminal", "--container", container]
    if workdir:
        args += ["--workdir", workdir]
    if memory_mb:
        args += ["--memory-mb", str(memory_mb)]
    if cgroup:
        args += ["--cgroup", cgroup]
    return args


if __name__ == "__main__":
    main()
