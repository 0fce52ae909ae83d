"""A rollout's services: the compose file's containers beside the main one, on the rollout's network.

`ServiceGroup.start` creates the rollout's network (gymflow.envs.runtime.network), builds or finds
each service's image, and starts every service but the main one as soon as the services it depends
on meet their conditions (started, healthy, exited 0), several at once where the order allows. Each
container gets gymflow's labels (plus `gymflow.services`, the group's network, to tell the group's
containers from the main one), limits (the file's, else `DEFAULT_LIMITS`), `--init`,
`no-new-privileges`, a fixed address on the network, the service name as its alias and `--add-host`
entries for every service, and the network's isolation rules before it is reported started.

Healthchecks are run by gymflow, not by the engine (podman and docker run them differently, and
podman runs them from systemd timers these nodes do not have): the test is `exec`ed in the container
with its timeout; the first probe runs as soon as the container is up, the next after `interval`
(at most a second apart within `start_period`, whose failures do not count), and `retries` failures
in a row fail the start. `start` returns once every condition the main service waits for holds and
every service with a healthcheck is healthy, within one overall deadline (`ready_timeout_s`); a
failure is a `SandboxError` naming the service, with the end of its log.

The main container is the runtime's (it owns its disk and workspace): it joins with `main_flags()`
and, once started, gets the same isolation with `isolate(pid)`. `close` removes the group's
containers and then its network, so the runtime removes the main container first. It is idempotent,
runs after a partial start too, and finds containers by label as well as by the names it recorded,
so a `run` that timed out after the engine created its container leaks nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from ipaddress import IPv4Address
from pathlib import Path

from gymflow.envs.errors import EngineError, SandboxError
from gymflow.envs.runtime import network as net
from gymflow.envs.runtime.compose import ComposeProject, Condition, Service, ServiceLimits
from gymflow.envs.runtime.engine import LABEL_MARKER, Engine
from gymflow.envs.runtime.images import build_image, ensure_base

log = logging.getLogger(__name__)

LABEL_SERVICES = "gymflow.services"
"""On a service container: the network of its group (the group's id)."""
LABEL_SERVICE = "gymflow.service"
"""On a service container: its service name."""
DEFAULT_LIMITS = ServiceLimits(cpus=1.0, memory_bytes=512 * 1024 * 1024, pids=256)
"""A service's limits where the file names none (memory is also the swap limit: no swap)."""
READY_TIMEOUT_S = 300.0
ENGINE_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 50
_START_PERIOD_POLL_S = 1.0


class ServiceGroup:
    """The non-main services of one rollout and their network.

    Args:
        engine: The engine to run them with.
        project: The parsed compose file.
        labels: The rollout's labels (`gymflow.node`, `gymflow.rollout`, `gymflow.owner`), on every
            container and on the network; `gymflow=1` is added.
        state_dir: The node's runtime directory (build lock files).
        ready_timeout_s: The limit of the whole `start`, builds included.
        pool_cidr: The network pool (default `GYMFLOW_NETWORK_POOL`, else 10.213.0.0/16).
    """

    def __init__(
        self,
        engine: Engine,
        project: ComposeProject,
        *,
        labels: Mapping[str, str],
        state_dir: Path,
        ready_timeout_s: float = READY_TIMEOUT_S,
        pool_cidr: str | None = None,
    ) -> None:
        self.engine = engine
        self.project = project
        self.labels = {LABEL_MARKER: "1", **labels}
        self.state_dir = state_dir
        self.ready_timeout_s = ready_timeout_s
        self.pool_cidr = pool_cidr
        self.network: net.RolloutNetwork | None = None
        self.containers: dict[str, str] = {}
        """Service name -> container name, recorded before its `run`."""
        self.addresses: dict[str, IPv4Address] = {}
        self._group = f"group-{uuid.uuid4().hex[:12]}"
        self._started: dict[str, asyncio.Event] = {}
        self._healthy: dict[str, asyncio.Event] = {}
        self._completed: dict[str, asyncio.Event] = {}
        self._closed = False

    async def __aenter__(self) -> ServiceGroup:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Create the network and start every service but main; return when main may start.

        Raises:
            SandboxError: A service failed to build, start, become healthy or complete (the message
                names it and carries its log tail), or the deadline passed. What was started is
                removed before it is raised.
        """
        sidecars = self.project.sidecars()
        for service in sidecars:
            if self.project.main in service.depends_on:
                raise SandboxError(f"service {service.name!r} depends on the main service: gymflow starts main last")
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                self.network = await net.create_network(self.engine, labels=self.labels, pool_cidr=self.pool_cidr)
                self.addresses = assign(self.network, [self.project.main, *(s.name for s in sidecars)])
                for service in sidecars:
                    self._started[service.name] = asyncio.Event()
                    self._healthy[service.name] = asyncio.Event()
                    self._completed[service.name] = asyncio.Event()
                images = await self._images(sidecars)
                async with asyncio.TaskGroup() as group:
                    for service in sidecars:
                        group.create_task(self._run(service, images[service.name]))
                    group.create_task(self._wait_for(self.project.main_service))
        except BaseException as exc:
            message = ""
            if isinstance(exc, TimeoutError):  # the logs, before close removes the containers
                waiting = [s.name for s in sidecars if not self._ready(s)]
                tails = [await self._describe(name) for name in waiting]
                message = f"services not ready after {self.ready_timeout_s:g}s: {', '.join(waiting)}\n" + "\n".join(
                    tails
                )
            with contextlib.suppress(Exception):
                await asyncio.shield(self.close())
            if message:
                raise SandboxError(message) from None
            if isinstance(exc, BaseExceptionGroup):
                first = _first_error(exc)
                if first is not None:
                    raise first from None
            raise

    def main_flags(self) -> list[str]:
        """The flags the main container's `run` adds to join: network, address, alias, service names."""
        if self.network is None:
            raise SandboxError("the service group is not started")
        main = self.project.main
        flags = ["--network", self.network.name, "--ip", str(self.addresses[main]), "--network-alias", main]
        return [*flags, *self._host_flags()]

    async def isolate(self, pid: int) -> None:
        """Load the network's isolation rules into the main container (pid: its init, from `inspect`)."""
        if self.network is None:
            raise SandboxError("the service group is not started")
        await net.isolate(pid, self.network)

    async def close(self) -> None:
        """Remove the group's containers, then its network; idempotent.

        Raises:
            SandboxError: A container or the network could not be removed (the reaper will).
        """
        names = set(self.containers.values())
        with contextlib.suppress(EngineError):
            found = await self.engine.containers({**self.labels, LABEL_SERVICES: self._group})
            names |= {c.name for c in found}
        await self.engine.remove(sorted(names))
        left = await self.engine.containers({**self.labels, LABEL_SERVICES: self._group})
        if left:
            raise SandboxError(f"service containers not removed: {', '.join(c.name for c in left)}")
        self.containers.clear()
        if self.network is not None:
            await net.remove_networks(self.engine, [self.network.name])
            net.forget(self.engine, self.network)
            self.network = None
        self._closed = True

    async def _images(self, services: list[Service]) -> dict[str, str]:
        """Each service's image: built once per node from its context, or found on the node."""

        async def one(service: Service) -> str:
            if service.build is not None:
                name = f"{Path(self.project.source).parent.name}-{service.name}"
                return await build_image(
                    self.engine,
                    name=name,
                    context=service.build.context,
                    dockerfile=service.build.dockerfile,
                    state_dir=self.state_dir,
                )
            assert service.image is not None
            await ensure_base(self.engine, service.image, state_dir=self.state_dir)
            return service.image

        refs = await asyncio.gather(*(one(s) for s in services))
        return {s.name: ref for s, ref in zip(services, refs, strict=True)}

    async def _run(self, service: Service, image: str) -> None:
        await self._wait_for(service)
        assert self.network is not None
        name = f"gymflow-{uuid.uuid4().hex[:12]}"
        self.containers[service.name] = name
        limits = service.limits
        cpus = limits.cpus or DEFAULT_LIMITS.cpus
        memory = str(limits.memory_bytes or DEFAULT_LIMITS.memory_bytes)
        pids = limits.pids or DEFAULT_LIMITS.pids
        labels = {**self.labels, LABEL_SERVICES: self._group, LABEL_SERVICE: service.name}
        args = ["run", "-d", "--name", name, "--pull=never", *self.engine.run_flags(), "--init"]
        args += [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]
        args += ["--cpus", f"{cpus:g}", "--memory", memory, "--memory-swap", memory, "--pids-limit", str(pids)]
        args += ["--ulimit", f"nproc={pids}:{pids}"]  # given explicitly: the default raise is refused here
        args += ["--security-opt", "no-new-privileges", "--hostname", service.hostname or service.name]
        args += ["--network", self.network.name, "--ip", str(self.addresses[service.name])]
        args += ["--network-alias", service.name, *self._host_flags()]
        for key, value in service.environment.items():
            args += ["--env", f"{key}={value}"]
        if service.working_dir:
            args += ["--workdir", service.working_dir]
        if service.user:
            args += ["--user", service.user]
        command = list(service.command or [])
        if service.entrypoint is not None:
            args += ["--entrypoint", service.entrypoint[0] if service.entrypoint else ""]
            command = [*service.entrypoint[1:], *command]
        try:
            await self.engine.run([*args, image, *command], timeout_s=ENGINE_TIMEOUT_S)
            pid = await self.engine.run(["inspect", "--format", "{{.State.Pid}}", name], timeout_s=ENGINE_TIMEOUT_S)
            if int(pid.stdout.strip() or 0):  # 0: it has exited already, and has no namespace to guard
                await net.isolate(int(pid.stdout.strip()), self.network)
        except EngineError as exc:
            raise SandboxError(f"service {service.name!r} did not start: {exc}\n{await self._logs(name)}") from None
        self._started[service.name].set()
        if service.healthcheck is not None:
            await self._probe(service, name)
            self._healthy[service.name].set()
        if any(s.depends_on.get(service.name) is Condition.COMPLETED for s in self.project.services.values()):
            await self._exit(service, name)
            self._completed[service.name].set()

    async def _wait_for(self, service: Service) -> None:
        for dep, condition in service.depends_on.items():
            events = {Condition.STARTED: self._started, Condition.HEALTHY: self._healthy}
            await events.get(condition, self._completed)[dep].wait()

    async def _probe(self, service: Service, name: str) -> None:
        """Run the healthcheck until it passes; `retries` failures after the start period fail it."""
        check = service.healthcheck
        assert check is not None
        began, failures, last = time.monotonic(), 0, ""
        while True:
            state = await self._state(name)
            if state is not None:
                raise SandboxError(
                    f"service {service.name!r} exited ({state}) before it was healthy\n" + await self._logs(name)
                )
            try:
                done = await self.engine.run(["exec", name, *check.test], timeout_s=check.timeout_s, check=False)
                if done.returncode == 0:
                    return
                last = f"exit {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}"
            except EngineError:
                last = f"timed out after {check.timeout_s:g}s"
            in_start_period = time.monotonic() - began < check.start_period_s
            failures += 0 if in_start_period else 1
            if failures >= check.retries:
                raise SandboxError(
                    f"service {service.name!r} failed its healthcheck {failures} times (last: {last})\n"
                    + await self._logs(name)
                )
            await asyncio.sleep(min(check.interval_s, _START_PERIOD_POLL_S) if in_start_period else check.interval_s)

    async def _exit(self, service: Service, name: str) -> None:
        """Wait for the container to exit 0 (service_completed_successfully)."""
        delay = 0.1
        while (code := await self._state(name)) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        if code != 0:
            raise SandboxError(f"service {service.name!r} exited with {code}, not 0\n" + await self._logs(name))

    async def _state(self, name: str) -> int | None:
        """None while the container runs, else its exit code."""
        fmt = '{"running": {{json .State.Running}}, "code": {{json .State.ExitCode}}}'
        done = await self.engine.run(["inspect", "--format", fmt, name], timeout_s=ENGINE_TIMEOUT_S)
        state = json.loads(done.stdout)
        return None if state["running"] else int(state["code"])

    async def _logs(self, name: str) -> str:
        try:
            done = await self.engine.run(["logs", "--tail", str(LOG_TAIL_LINES), name], timeout_s=30, check=False)
        except EngineError as exc:
            return f"(no logs: {exc})"
        text = (done.stdout + done.stderr).strip()
        return f"--- its log (last {LOG_TAIL_LINES} lines) ---\n{text}" if text else "--- its log is empty ---"

    async def _describe(self, service: str) -> str:
        name = self.containers.get(service)
        return f"{service}: not started" if name is None else f"{service}: {await self._logs(name)}"

    def _ready(self, service: Service) -> bool:
        started = self._started.get(service.name)
        healthy = self._healthy.get(service.name)
        return bool(started and started.is_set() and (service.healthcheck is None or (healthy and healthy.is_set())))

    def _host_flags(self) -> list[str]:
        return [arg for svc, address in self.addresses.items() for arg in ("--add-host", f"{svc}:{address}")]


def assign(network: net.RolloutNetwork, services: list[str]) -> dict[str, IPv4Address]:
    """Each service's fixed address on `network`, in order.

    Raises:
        SandboxError: More services than the network has addresses.
    """
    addresses = list(network.addresses())
    if len(services) > len(addresses):
        raise SandboxError(
            f"{len(services)} services: more than a /{net.SUBNET_PREFIX} network holds ({len(addresses)})"
        )
    return dict(zip(services, addresses, strict=False))


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first SandboxError (else the first error) of a task group's failure."""
    flat: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            flat.append(exc)

    walk(group)
    return next((e for e in flat if isinstance(e, SandboxError)), flat[0] if flat else None)
