"""The base-image bootstrap end to end: Debian's packages (mmdebstrap) imported as an image, under a
tag of its own so the image the other tests use is left alone; a container then runs from it."""

from __future__ import annotations

import time

import figures
import pytest
from container_support import engine_or_skip

from gymflow.envs.runtime.images import bootstrap_debian

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TAG = "localhost/gymflow-test/bootstrap:bookworm"


async def test_bootstrap_makes_a_runnable_debian_image() -> None:
    engine = engine_or_skip()
    await engine.run(["rmi", "-f", TAG], check=False)
    started = time.monotonic()
    try:
        await bootstrap_debian(engine, TAG, suite="bookworm")
        took = time.monotonic() - started
        flags = [*engine.run_flags(), "--ulimit", "nproc=512:512", "--network", "none"]  # nproc: see limit_flags
        ran = await engine.run(["run", "--rm", *flags, TAG, "cat", "/etc/os-release"])
        assert "VERSION_CODENAME=bookworm" in ran.stdout
        config = await engine.image_config(TAG)
        assert any(str(e).startswith("PATH=") for e in config.get("Env") or [])  # type: ignore[union-attr]
        figures.record("containers", "debian bookworm bootstrapped from Debian's packages", seconds=round(took, 1))
    finally:
        await engine.run(["rmi", "-f", TAG], check=False)
