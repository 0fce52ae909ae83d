"""Workspace copies refuse every way out of the workspace: `..`, absolute paths, planted symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp_support import MakeEnv

from gymflow.envs.errors import WorkspaceError
from gymflow.envs.runtime import workspace as ws

ESCAPES = ["../outside.txt", "a/../../outside.txt", "/etc/passwd", "//etc/passwd", "a\x00b"]


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return root, outside


@pytest.mark.parametrize("name", ESCAPES)
def test_copy_in_and_write_refuse_escaping_names(roots: tuple[Path, Path], tmp_path: Path, name: str) -> None:
    root, _ = roots
    src = tmp_path / "src.txt"
    src.write_text("x")
    with pytest.raises(WorkspaceError):
        ws.copy_in(root, src, name)
    with pytest.raises(WorkspaceError):
        ws.write_in(root, "x", name)
    assert not (tmp_path / "outside.txt").exists()


@pytest.mark.parametrize("name", ESCAPES)
def test_copy_out_refuses_escaping_names(roots: tuple[Path, Path], tmp_path: Path, name: str) -> None:
    root, _ = roots
    with pytest.raises(WorkspaceError):
        ws.copy_out(root, name, tmp_path / "dst.txt")
    assert not (tmp_path / "dst.txt").exists()


def test_symlink_planted_as_copy_in_destination_is_refused(roots: tuple[Path, Path], tmp_path: Path) -> None:
    root, outside = roots
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "dir").symlink_to(outside, target_is_directory=True)
    src = tmp_path / "src.txt"
    src.write_text("overwritten")
    for name in ("link.txt", "dir/new.txt", "dir/secret.txt"):
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            ws.copy_in(root, src, name)
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            ws.write_in(root, "overwritten", name)
    assert (outside / "secret.txt").read_text() == "secret"
    assert not (outside / "new.txt").exists()


def test_symlink_planted_as_copy_out_source_is_refused(roots: tuple[Path, Path], tmp_path: Path) -> None:
    root, outside = roots
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "dir").symlink_to(outside, target_is_directory=True)
    (root / "abs.txt").symlink_to("/etc/passwd")
    for name in ("link.txt", "dir/secret.txt", "abs.txt"):
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            ws.copy_out(root, name, tmp_path / "dst.txt")
    assert not (tmp_path / "dst.txt").exists()


def test_symlink_inside_the_workspace_is_fine(roots: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = roots
    (root / "real.txt").write_text("ok")
    (root / "alias.txt").symlink_to(root / "real.txt")
    assert ws.copy_out(root, "alias.txt", tmp_path / "dst.txt").read_text() == "ok"


def test_copies_are_bounded(roots: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = roots
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(WorkspaceError, match="over the 1024-byte copy limit"):
        ws.copy_in(root, big, max_bytes=1024)
    with pytest.raises(WorkspaceError, match="over the 1024-byte copy limit"):
        ws.write_in(root, b"x" * 2048, "big.bin", max_bytes=1024)
    (root / "big.bin").write_bytes(b"x" * 2048)
    with pytest.raises(WorkspaceError, match="over the 1024-byte copy limit"):
        ws.copy_out(root, "big.bin", tmp_path / "out.bin", max_bytes=1024)


async def test_env_copies_refuse_a_link_a_rollout_planted(make_env: MakeEnv, tmp_path: Path) -> None:
    """Through McpEnv on a live rollout: the traversal refusals surface as ToolErrors."""
    env = make_env()
    await env.init_rollout("r")
    workspace = env.workspace("r")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    os.symlink(secret, workspace / "planted.txt")
    with pytest.raises(WorkspaceError):
        await env.copy_from_workspace("r", "planted.txt", tmp_path / "stolen.txt")
    with pytest.raises(WorkspaceError):
        await env.copy_content_to_workspace("r", "pwned", "planted.txt")
    with pytest.raises(WorkspaceError):
        await env.copy_to_workspace("r", secret, "../escape.txt")
    assert secret.read_text() == "secret" and not (tmp_path / "stolen.txt").exists()
    await env.copy_content_to_workspace("r", "hello", "notes/a.txt")
    result = await env.run_tool("r", "list_files")
    assert "notes" in result.text and "planted.txt" in result.text


async def test_a_call_that_leaves_the_workspace_over_its_quota_is_an_error_observation(make_env: MakeEnv) -> None:
    env = make_env(default_workspace_quota_mb=1)
    await env.init_rollout("q")
    fine = await env.run_tool("q", "write_note", name="small.txt", text="x" * 1000)
    assert not fine.is_error and fine.text == "wrote small.txt"
    over = await env.run_tool("q", "write_note", name="big.txt", text="x" * (2 * 1024 * 1024))
    assert over.is_error and over.text.startswith("wrote big.txt")
    assert "over its 1 MB disk quota: delete files before writing more" in over.text
    with pytest.raises(ValueError, match="the task's files do not fit"):
        await env.init_rollout("too-big", files={"data.bin": b"x" * (2 * 1024 * 1024)})
    assert ws.usage(env.workspace("q")) > 2 * 1024 * 1024
