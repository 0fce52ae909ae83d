"""Per-rollout workspaces: a directory the rollout's servers run in, its seeding, and safe copies.

benchmax joins user-supplied names onto the workspace path, so `../../etc/passwd` or an
absolute path walks out of it. Here every name is resolved (symlinks included) and must stay
inside the workspace, and copies are bounded in size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path, PurePosixPath

from pydantic import Field, field_validator

from gymflow.envs.contract import Wire
from gymflow.envs.errors import InfraError, WorkspaceError
from gymflow.envs.runtime.transport import server_env

MAX_COPY_BYTES = 256 * 1024 * 1024
"""Largest single file copied into or out of a workspace."""


DEFAULT_QUOTA_MB = 1024
"""Disk a rollout's workspace may hold unless the worker (`Settings.workspace_quota_mb`) or the env says otherwise."""


def usage(root: Path) -> int:
    """Bytes of disk the tree under `root` occupies (allocated blocks; links not followed, hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            try:
                st = os.lstat(os.path.join(directory, name))
            except OSError:  # removed meanwhile
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def over_quota(root: Path, quota_mb: int) -> str | None:
    """A note the model can act on when the workspace holds more than `quota_mb` MB, else None."""
    used = usage(root)
    if used <= quota_mb * 1024 * 1024:
        return None
    return (
        f"the workspace holds {used / 2**20:.1f} MB, over its {quota_mb} MB disk quota: "
        "delete files before writing more"
    )


def check_quota(root: Path, quota_mb: int) -> None:
    """Raise ValueError when what was staged into a workspace is already over its quota."""
    over = over_quota(root, quota_mb)
    if over is not None:
        raise ValueError(f"the task's files do not fit: {over}")


def resolve_inside(root: Path, name: str | Path) -> Path:
    """The path of `name` inside `root`, refusing anything that would land outside it.

    Refuses absolute paths, `..` components, NUL bytes, and paths that leave `root` through a
    symlink (checked on the fully resolved path, so a link planted by a tool is caught too).
    """
    text = str(name)
    if not text or "\x00" in text:
        raise WorkspaceError(f"invalid workspace path {text!r}")
    pure = PurePosixPath(text)
    if pure.is_absolute() or Path(text).is_absolute():
        raise WorkspaceError(f"absolute paths are not allowed in a workspace: {text!r}")
    if ".." in pure.parts:
        raise WorkspaceError(f"'..' is not allowed in a workspace path: {text!r}")
    base = root.resolve()
    target = (base / pure).resolve()
    if target != base and base not in target.parents:
        raise WorkspaceError(f"path {text!r} resolves outside the workspace")
    return target


def copy_in(root: Path, src: Path, dst_name: str | None = None, *, max_bytes: int = MAX_COPY_BYTES) -> Path:
    """Copy a local file into the workspace; returns where it landed."""
    if not src.is_file():
        raise WorkspaceError(f"source file not found: {src}")
    size = src.stat().st_size
    if size > max_bytes:
        raise WorkspaceError(f"{src} is {size} bytes, over the {max_bytes}-byte copy limit")
    target = resolve_inside(root, dst_name or src.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, target)
    return target


def write_in(root: Path, content: str | bytes, dst_name: str, *, max_bytes: int = MAX_COPY_BYTES) -> Path:
    """Create a file with `content` in the workspace."""
    data = content.encode() if isinstance(content, str) else content
    if len(data) > max_bytes:
        raise WorkspaceError(f"content is {len(data)} bytes, over the {max_bytes}-byte copy limit")
    target = resolve_inside(root, dst_name)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def copy_out(root: Path, src_name: str, dst: Path, *, max_bytes: int = MAX_COPY_BYTES) -> Path:
    """Copy a workspace file out to `dst` (a local path chosen by the caller, not the model)."""
    source = resolve_inside(root, src_name)
    if not source.is_file():
        raise WorkspaceError(f"no file {src_name!r} in the workspace")
    size = source.stat().st_size
    if size > max_bytes:
        raise WorkspaceError(f"{src_name!r} is {size} bytes, over the {max_bytes}-byte copy limit")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dst)
    return dst


SETUP_OUTPUT_CHARS = 2000
"""How much of a failed setup command's output its error shows (the end of it)."""


class WorkspaceSeed(Wire):
    """What every workspace of an env starts with, before its servers start (env file: `workspace:`).

    Seeding runs when a server set is created, so the warm pool prepares workspaces ahead of
    demand: a slow setup (a `git init`, a database import) costs a rollout nothing when the pool
    has a set ready.
    """

    files: dict[str, str] = Field(default_factory=dict)
    """Workspace path -> source path (a file, or a directory copied whole); in an env file, sources
    are relative to the file."""
    setup: str | list[str] | None = None
    """A command run in the workspace (its cwd) after the files are in: a string goes to `/bin/sh -c`,
    a list is the argv. `{workspace}` is replaced by the workspace's path; the command also finds it
    in `$GYMFLOW_WORKSPACE`, and gets the environment servers get. A non-zero exit fails the set."""
    setup_timeout_s: float = Field(default=60.0, gt=0)
    """Time limit of the setup command; its whole process group is killed after it."""

    @field_validator("files")
    @classmethod
    def _inside(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            pure = PurePosixPath(name)
            if not name or pure.is_absolute() or ".." in pure.parts or "\x00" in name:
                raise ValueError(f"workspace file {name!r} must be a relative path inside the workspace")
        return value

    @field_validator("setup")
    @classmethod
    def _command(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is not None and not (value.strip() if isinstance(value, str) else value):
            raise ValueError("an empty setup command; leave 'setup' out instead")
        return value


async def seed_workspace(root: Path, seed: WorkspaceSeed) -> None:
    """Copy `seed.files` into the workspace `root`, then run `seed.setup` in it.

    Raises:
        InfraError: A source is missing, or the setup command failed or timed out (its output's end
            is in the message).
    """
    if seed.files:
        await asyncio.to_thread(_copy_files, root, seed.files)
    if seed.setup is not None:
        await _run_setup(root, seed)


def _copy_files(root: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        src, target = Path(source), resolve_inside(root, name)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, target, dirs_exist_ok=True, symlinks=True)
            else:
                shutil.copyfile(src, target)
        except OSError as exc:
            raise InfraError(f"cannot seed workspace file {name!r} from {source}: {exc}") from exc


async def _run_setup(root: Path, seed: WorkspaceSeed) -> None:
    command = seed.setup
    assert command is not None
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    argv = [arg.replace("{workspace}", str(root)) for arg in argv]
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=root,
        env=server_env({"GYMFLOW_WORKSPACE": str(root)}),  # what servers get: no worker secrets
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), seed.setup_timeout_s)
    except BaseException as exc:  # a timeout, or the init being cancelled: leave nothing running
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        if isinstance(exc, TimeoutError):
            raise InfraError(f"workspace setup {command!r} timed out after {seed.setup_timeout_s:g}s") from None
        raise
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything it left in the background
    if process.returncode:
        tail = output.decode(errors="replace")[-SETUP_OUTPUT_CHARS:].strip()
        raise InfraError(f"workspace setup {command!r} exited with code {process.returncode}: {tail}")


def check_workspace(workspace: Path) -> None:
    """Refuse a workspace path that exists with content (it is about to become a link)."""
    if workspace.is_symlink() or (workspace.exists() and (not workspace.is_dir() or any(workspace.iterdir()))):
        raise ValueError(f"the workspace {workspace} must not exist yet or be an empty directory")


def link_workspace(workspace: Path, target: Path) -> None:
    """Make the caller's workspace path a link to the container's workspace on its capped disk."""
    with contextlib.suppress(FileNotFoundError):
        workspace.rmdir()
    workspace.parent.mkdir(parents=True, exist_ok=True)
    workspace.symlink_to(target, target_is_directory=True)
