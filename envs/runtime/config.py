"""Which runtime a rollout's servers and commands run in: the `runtime:` key of env files and envs.

    runtime: {kind: container, image: localhost/my/tools:1, limits: {memory_mb: 1024, pids: 256}}
    runtime: {kind: container, build: ./image}      # a build context (Dockerfile inside), built once per node
    runtime: {kind: bwrap, limits: {memory_mb: 512}}  # bubblewrap on the worker's own root, no network
    runtime: {kind: process}                          # local processes in the workspace (the default)

An env's `runtime` gives each rollout one sandbox, and every MCP server of the env runs inside it
(its command is spawned through `Sandbox.stdio_command`, e.g. `podman exec -i`). A server may name
its own `runtime` instead: `{kind: process}` keeps it on the worker (a host-side server that acts on
the rollout's sandbox by its name, `{sandbox}` in its args), another container config gives it a
sandbox of its own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gymflow.envs.contract import Wire
from gymflow.envs.runtime.base import Limits

RuntimeKind = Literal["process", "container", "bwrap"]


class RuntimeConfig(Wire):
    """Where one rollout's servers and commands run, and with what limits."""

    kind: RuntimeKind = "process"
    """`process`: local processes (no isolation beyond the workspace); `container`: one container per
    rollout on the node's engine (gymflow.envs.runtime.container); `bwrap`: bubblewrap on the worker's
    root filesystem, only the workspace writable (gymflow.envs.runtime.bwrap)."""
    image: str | None = None
    """Container image on the node (`podman images`; nothing is pulled: nodes may reach no registry)."""
    build: str | None = None
    """Instead of `image`: a build context directory holding a Dockerfile, built once per node under a
    content-hash tag (relative paths are relative to the env file)."""
    build_timeout_s: float = Field(default=600.0, gt=0)
    """Limit of that build."""
    limits: Limits = Field(default_factory=Limits)
    """CPU, memory, disk, pids and network of the container."""
    workdir: str | None = None
    """Working directory of commands and servers inside the container (default: the image's)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of everything run in the container."""
    workspace_mount: str = "/workspace"
    """Where the rollout's workspace appears inside the container."""

    @model_validator(mode="after")
    def _image_for_containers(self) -> RuntimeConfig:
        if self.kind == "container" and (self.image is None) == (self.build is None):
            raise ValueError("a container runtime needs exactly one of 'image' and 'build'")
        if self.kind != "container" and (self.image or self.build):
            raise ValueError(f"the {self.kind} runtime runs no image; use kind: container")
        return self

    @property
    def isolated(self) -> bool:
        """Whether servers under this config run in a sandbox of their own (not as plain local processes)."""
        return self.kind != "process"
