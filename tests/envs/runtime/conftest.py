"""Fixtures of the runtime tests: a real podman (skipped without one), nothing left behind."""

from container_support import base_image, runtime

__all__ = ["base_image", "runtime"]
