"""Container test fixtures (imported by the runtime and harbor conftests).

A real podman, a fresh node id per test, nothing left behind.

The tests skip when no engine is installed (`apt-get install podman runc`). The base image is made
from Debian's packages on first use (a few minutes, once per machine).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gymflow.envs.runtime.container import ContainerRuntime
from gymflow.envs.runtime.engine import INSTALL_HINT, LABEL_MARKER, LABEL_NODE, Engine
from gymflow.envs.runtime.images import ensure_base
from gymflow.envs.runtime.reaper import reap

BASE_IMAGE = "debian:bookworm-slim"
STATE_ROOT = Path("/var/tmp/gymflow-test-runtime")
"""Not under pytest's tmp_path: the capped disks are loop-mounted, and tmp_path may be a tmpfs."""


def engine_or_skip() -> Engine:
    if shutil.which("podman") is None or shutil.which("mkfs.ext4") is None:
        pytest.skip(f"no container engine on this machine: {INSTALL_HINT}")
    return Engine.detect("podman")


@pytest.fixture(scope="session")
async def base_image() -> str:
    engine = engine_or_skip()
    await ensure_base(engine, BASE_IMAGE, state_dir=STATE_ROOT)
    return BASE_IMAGE


async def leftovers(engine: Engine, node_id: str) -> list[str]:
    return [c.name for c in await engine.containers({LABEL_MARKER: "1", LABEL_NODE: node_id})]


@pytest.fixture
async def runtime(base_image: str) -> AsyncIterator[ContainerRuntime]:
    """A runtime on a node of its own; the test fails if any container of that node survives it."""
    node = f"test-{uuid.uuid4().hex[:8]}"
    rt = ContainerRuntime(node_id=node, state_root=STATE_ROOT)
    try:
        yield rt
    finally:
        await rt.close()
        left = await leftovers(rt.engine, node)
        await reap(rt.engine, node_id=node, state_root=STATE_ROOT, live_rollouts=(), owner=None)
        assert not left, f"containers left behind by the test: {left}"
        assert not any((STATE_ROOT / node).glob("gymflow-*")), "container disks left behind"
