"""Container test fixtures (imported by the runtime and harbor conftests).

A real engine, a fresh node id per test, nothing left behind. The engine is the one gymflow itself
picks (`GYMFLOW_CONTAINER_ENGINE`: podman by default, where installed); .ci/run runs the container
and Harbor tests a second time with `GYMFLOW_CONTAINER_ENGINE=docker` against a dockerd it starts.

The tests skip when no engine is installed, naming the install command; with
`GYMFLOW_CONTAINER_TEST_REQUIRE` set (.ci/run sets it once it installed the engine) they fail instead.
The base image is made from Debian's packages on first use (a minute or two, once per machine): the
tests that need it get `BOOTSTRAP_BUDGET_S` (`add_bootstrap_budget`), and the time it took is a figure.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import figures
import pytest

from gymflow.envs.runtime.container import ContainerRuntime
from gymflow.envs.runtime.engine import INSTALL_HINT, LABEL_MARKER, LABEL_NODE, Engine, EngineUnavailable
from gymflow.envs.runtime.images import ensure_base
from gymflow.envs.runtime.reaper import reap

BASE_IMAGE = "debian:bookworm-slim"
STATE_ROOT = Path("/var/tmp/gymflow-test-runtime")
"""Not under pytest's tmp_path: the capped disks are loop-mounted, and tmp_path may be a tmpfs."""


REQUIRE_ENV = "GYMFLOW_CONTAINER_TEST_REQUIRE"
BOOTSTRAP_BUDGET_S = 900
"""Timeout of a test that may be the one making the base image (a fresh machine)."""


def engine_or_skip() -> Engine:
    """The engine under test (as `Engine.detect()` finds it), or a skip naming the install command."""
    try:
        engine = Engine.detect()
    except EngineUnavailable as exc:
        message = str(exc)
    else:
        if shutil.which("mkfs.ext4") is not None:
            return engine
        message = f"mkfs.ext4 is missing: {INSTALL_HINT}"
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{message} ({REQUIRE_ENV} is set: the container tests are required)")
    pytest.skip(message)


def add_bootstrap_budget(items: list[pytest.Item]) -> None:
    """Give every test using `base_image` the time a first bootstrap takes (its default is 120 s)."""
    for item in items:
        if "base_image" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(BOOTSTRAP_BUDGET_S))


@pytest.fixture(scope="session")
async def base_image() -> str:
    engine = engine_or_skip()
    missing = not await engine.image_exists(BASE_IMAGE)
    started = time.monotonic()
    await ensure_base(engine, BASE_IMAGE, state_dir=STATE_ROOT)
    if missing:
        figures.record("containers", f"{BASE_IMAGE} bootstrapped (mmdebstrap + import)", seconds=round(
            time.monotonic() - started, 1))  # fmt: skip
    return BASE_IMAGE


async def leftovers(engine: Engine, node_id: str) -> list[str]:
    return [c.name for c in await engine.containers({LABEL_MARKER: "1", LABEL_NODE: node_id})]


@pytest.fixture
async def runtime(base_image: str) -> AsyncIterator[ContainerRuntime]:
    """A runtime on a node of its own; the test fails if any container of that node survives it."""
    node = f"test-{uuid.uuid4().hex[:8]}"
    rt = ContainerRuntime(node_id=node, state_root=STATE_ROOT, engine=engine_or_skip())
    try:
        yield rt
    finally:
        await rt.close()
        left = await leftovers(rt.engine, node)
        await reap(rt.engine, node_id=node, state_root=STATE_ROOT, live_rollouts=(), owner=None)
        assert not left, f"containers left behind by the test: {left}"
        assert not any((STATE_ROOT / node).glob("gymflow-*")), "container disks left behind"
