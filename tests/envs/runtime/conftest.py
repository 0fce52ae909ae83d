"""Fixtures of the runtime tests: a real podman (skipped without one), nothing left behind."""

import pytest
from container_support import add_bootstrap_budget, base_image, runtime

__all__ = ["base_image", "runtime"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    add_bootstrap_budget(items)
