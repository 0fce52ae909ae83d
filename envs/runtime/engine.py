"""The container engine boundary: podman or docker, driven through its command-line client.

Why the CLI rather than the Docker Engine API (docker-py, aiodocker):

* Rootful podman, as installed on these nodes, runs no service: the API would need a
  `podman system service` daemon per node to start, watch and restart. The CLI needs nothing
  running, and a container outlives a crashed worker either way.
* An MCP server inside a container talks stdio. Through the CLI that is `podman exec -i NAME CMD`:
  a plain pipe any stdio MCP client spawns like a local server (`Sandbox.stdio_command`). Through the
  API it is a hijacked HTTP stream with Docker's multiplexed framing, which needs a transport of its
  own.
* The flags gymflow uses (run, exec, cp, rm, ps, inspect, build, image inspect/mount, import) mean the
  same in podman and docker, so one code path drives both.
The cost is one process per engine call; `bench/containers.py` measures it.

Engine settings: `GYMFLOW_CONTAINER_ENGINE` (or `Engine.detect(binary=...)`) is `podman`, `docker`, a
path to either, or `auto` (the default): podman when it is installed (it needs no daemon), else
docker when its daemon answers. A `docker` CLI whose daemon does not answer is no engine: a machine
may carry the client alone, and every container start would fail later. For podman the OCI runtime
is chosen too: `runc` when it is installed (crun, podman's usual default, fails on cgroup v1
kernels), overridden by `GYMFLOW_OCI_RUNTIME` or `oci_runtime=` (`""` for the engine's default).

Docker differences this module absorbs: builds run with `DOCKER_BUILDKIT=0` unless the caller's
environment says otherwise (a Docker CLI without the buildx plugin refuses to build at all under
BuildKit, and the classic builder resolves `FROM` to local images without a registry); `rm -f`
needs no grace flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gymflow.envs.errors import EngineError, EngineUnavailable
from gymflow.envs.runtime.base import CappedOutput, Limits, drain, feed_stdin

ENGINE_ENV = "GYMFLOW_CONTAINER_ENGINE"
"""Names the engine binary (a name on the PATH or a path)."""
OCI_RUNTIME_ENV = "GYMFLOW_OCI_RUNTIME"
"""Names podman's OCI runtime (`runc`, `crun`; empty for podman's default)."""
INSTALL_HINT = "apt-get install podman runc mmdebstrap e2fsprogs (or docker.io with dockerd running)"
"""What installs an engine on a Debian node."""

CLIENT_DIR = Path(tempfile.gettempdir()) / "gymflow-engine"
"""Working directory of every engine client process. Podman's conmon writes a file named `oom` into
the working directory of an `exec` whose process the kernel killed for memory: run anywhere else, a
test run or a worker would leave it in the user's current directory."""

LABEL_MARKER = "gymflow"
"""Set to "1" on every container and image gymflow creates."""
LABEL_NODE = "gymflow.node"
LABEL_ROLLOUT = "gymflow.rollout"
"""The rollout a container was created for; empty for a warm-pool container until it is taken."""
LABEL_OWNER = "gymflow.owner"
"""The runtime instance (one worker process) that created the container."""
LABEL_STATE = "gymflow.state"
"""The host directory holding the container's disk and mounts (the reaper unmounts it)."""

DAEMON_CHECK_TIMEOUT_S = 10.0
"""How long `detect` waits for a docker daemon's version."""
ENGINE_OUTPUT_BYTES = 256 * 1024
"""Output kept of one engine command (build logs are the long ones)."""


@dataclass(frozen=True)
class Completed:
    """An engine command's outcome."""

    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class ContainerInfo:
    """A container as the engine lists it."""

    name: str
    labels: dict[str, str]
    running: bool


class Engine:
    """A podman or docker CLI with the flags this node needs."""

    def __init__(self, binary: str, *, kind: Literal["podman", "docker"], oci_runtime: str | None = None) -> None:
        self.binary = binary
        self.kind = kind
        self.oci_runtime = oci_runtime or None
        """podman's `--runtime` (None: the engine's default)."""

    @classmethod
    def detect(cls, binary: str | None = None, *, oci_runtime: str | None = None) -> Engine:
        """The engine named by `binary` or `GYMFLOW_CONTAINER_ENGINE`, else (`auto`) podman, else docker
        whose daemon answers.

        Raises:
            EngineUnavailable: None is installed, or the docker named has no daemon (the message names
                the fix).
        """
        wanted = binary or os.environ.get(ENGINE_ENV) or "auto"
        candidates = ["podman", "docker"] if wanted == "auto" else [wanted]
        silent: list[str] = []
        for name in candidates:
            path = shutil.which(name)
            if path is None:
                continue
            kind: Literal["podman", "docker"] = "docker" if "docker" in os.path.basename(path) else "podman"
            if kind == "docker":
                why = docker_daemon_problem(path)
                if why is not None:
                    silent.append(why)
                    continue
            runtime = oci_runtime if oci_runtime is not None else os.environ.get(OCI_RUNTIME_ENV)
            if runtime is None and kind == "podman" and shutil.which("runc"):
                runtime = "runc"
            return cls(path, kind=kind, oci_runtime=runtime)
        if silent:
            raise EngineUnavailable(f"no container engine: {'; '.join(silent)}")
        named = f"{wanted!r} is not" if wanted != "auto" else "neither podman nor docker is"
        raise EngineUnavailable(f"no container engine: {named} on the PATH (install one: {INSTALL_HINT})")

    async def run(
        self,
        args: Sequence[str],
        *,
        timeout_s: float = 60.0,
        stdin: bytes | None = None,
        check: bool = True,
    ) -> Completed:
        """Run `<engine> args...`; on timeout its process group is killed.

        Raises:
            EngineError: It exited non-zero (with `check`), or timed out.
        """
        process = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            cwd=client_dir(),
            env=self.client_env(),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        out, err = CappedOutput(ENGINE_OUTPUT_BYTES), CappedOutput(ENGINE_OUTPUT_BYTES)
        try:
            await asyncio.wait_for(
                asyncio.gather(feed_stdin(process, stdin), drain(process.stdout, out), drain(process.stderr, err)),
                timeout_s,
            )
            await process.wait()
        except BaseException as exc:
            kill_session(process)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 5)
            if isinstance(exc, TimeoutError):
                raise EngineError(f"`{self.kind} {' '.join(args[:3])}` timed out after {timeout_s:g}s") from None
            raise
        done = Completed(process.returncode or 0, out.text(), err.text())
        if check and done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip())[-2000:]
            raise EngineError(f"`{self.kind} {' '.join(args[:3])}` failed ({done.returncode}): {tail}")
        return done

    def client_env(self) -> dict[str, str]:
        """The environment of an engine client process (docker: the classic builder unless told)."""
        env = dict(os.environ)
        if self.kind == "docker":
            env.setdefault("DOCKER_BUILDKIT", "0")
        return env

    async def container_pid(self, name: str) -> int:
        """The host pid of a running container's first process."""
        done = await self.run(["inspect", "--format", "{{.State.Pid}}", name])
        return int(done.stdout.strip() or 0)

    def run_flags(self) -> list[str]:
        """Flags every `run` gets: the OCI runtime, and ulimits given explicitly (the default raise of
        the open-files limit is refused on these nodes)."""
        hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        flags = ["--runtime", self.oci_runtime] if self.oci_runtime and self.kind == "podman" else []
        return [*flags, "--ulimit", f"nofile={hard_nofile}:{hard_nofile}"]

    def exec_argv(
        self,
        container: str,
        argv: Sequence[str],
        *,
        interactive: bool,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> list[str]:
        """The full host argv of `exec` in `container`."""
        flags = ["-i"] if interactive else []
        if workdir:
            flags += ["--workdir", workdir]
        for key, value in (env or {}).items():
            flags += ["--env", f"{key}={value}"]
        return [self.binary, "exec", *flags, container, *argv]

    async def image_exists(self, ref: str) -> bool:
        done = await self.run(["image", "inspect", "--format", "{{.Id}}", ref], check=False)
        return done.returncode == 0

    async def image_config(self, ref: str) -> dict[str, object]:
        """The image's config (Env, WorkingDir, User, ...)."""
        done = await self.run(["image", "inspect", "--format", "{{json .Config}}", ref])
        value = json.loads(done.stdout or "{}")
        return value if isinstance(value, dict) else {}

    async def containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        """Every container (running or not) carrying all of `labels`."""
        filters = [arg for key, value in labels.items() for arg in ("--filter", f"label={key}={value}")]
        listed = await self.run(["ps", "-a", *filters, "--format", "{{.Names}}"])
        names = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
        if not names:
            return []
        fmt = '{"name": {{json .Name}}, "labels": {{json .Config.Labels}}, "running": {{json .State.Running}}}'
        inspected = await self.run(["inspect", "--type", "container", "--format", fmt, *names], check=False)
        found = []
        for line in inspected.stdout.splitlines():
            if line.strip():
                item = json.loads(line)
                found.append(ContainerInfo(item["name"].lstrip("/"), item["labels"] or {}, bool(item["running"])))
        return found

    async def remove(self, names: Sequence[str]) -> None:
        """Kill and remove containers now (gone already is fine)."""
        if names:
            grace = ["-t", "0"] if self.kind == "podman" else []
            await self.run(["rm", "-f", *grace, *names], timeout_s=60, check=False)


_daemon_checked: dict[str, str | None] = {}


def docker_daemon_problem(binary: str) -> str | None:
    """Why the docker CLI at `binary` cannot reach a daemon (None: one answers). Asked once per process
    for a daemon that answers; a silent one is asked again next time (it may have been started since)."""
    if _daemon_checked.get(binary, "") is None:
        return None
    try:
        done = subprocess.run(
            [binary, "version", "--format", "{{.Server.Version}}"],
            capture_output=True, text=True, timeout=DAEMON_CHECK_TIMEOUT_S, cwd=client_dir(), check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the docker CLI at {binary} got no answer from a daemon ({exc})"
    if done.returncode != 0 or not done.stdout.strip():
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        detail = done.stderr.strip().splitlines()[-1:] or ["no server version"]
        return (
            f"the docker CLI at {binary} reaches no daemon at {host} ({detail[0]}); start dockerd "
            f"(`apt-get install docker.io`, then `dockerd &` or `systemctl start docker`) or install podman"
        )
    _daemon_checked[binary] = None
    return None


def client_dir() -> Path:
    """`CLIENT_DIR`, created on first use."""
    CLIENT_DIR.mkdir(parents=True, exist_ok=True)
    return CLIENT_DIR


def kill_session(process: asyncio.subprocess.Process) -> None:
    """SIGKILL a process started with `start_new_session` and everything in its group."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def rollout_labels(node_id: str, rollout_id: str, owner: str, state: str) -> dict[str, str]:
    """The labels of a rollout's containers (and of its services and network)."""
    return {LABEL_MARKER: "1", LABEL_NODE: node_id, LABEL_ROLLOUT: rollout_id, LABEL_OWNER: owner, LABEL_STATE: state}


def label_flags(labels: dict[str, str]) -> list[str]:
    return [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]


def limit_flags(limits: Limits, *, joins_network: bool = False) -> list[str]:
    """`run` flags of `limits`; `--network none` unless the limits or a rollout network (`joins_network`) give one."""
    memory = f"{limits.memory_mb}m"
    flags = ["--cpus", f"{limits.cpus:g}", "--memory", memory, "--memory-swap", memory]
    flags += ["--pids-limit", str(limits.pids), "--ulimit", f"nproc={limits.pids}:{limits.pids}"]
    return flags if limits.network or limits.network_allow or joins_network else [*flags, "--network", "none"]
