"""Per-rollout workspaces: a directory the rollout's servers run in, and safe copies in and out.

benchmax joins user-supplied names onto the workspace path, so `../../etc/passwd` or an
absolute path walks out of it. Here every name is resolved (symlinks included) and must stay
inside the workspace, and copies are bounded in size.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from envs.contract import ToolError

MAX_COPY_BYTES = 256 * 1024 * 1024
"""Largest single file copied into or out of a workspace."""


class WorkspaceError(ToolError):
    """A workspace path or copy was refused (escape attempt, too large, missing)."""


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
