"""A Harbor task's `environment/docker-compose.yaml`, parsed and checked: the subset tasks use.

Harbor runs a task's compose file on top of a base of its own, in which the service the agent works
in is called `main` and is built from the `environment/` directory (the file's own directory) and
kept alive with `sleep infinity`. So here: `main` is the main service; a file without one gets the
implied one (built from the directory's Dockerfile), or, failing that, the single service built
from `.`. The other services (a database, a web server) run beside it on the rollout's network,
where each is reachable by its service name (gymflow.envs.runtime.services).

Why gymflow does not run `docker compose` / `podman-compose`: one code path for both engines
(podman-compose only shells out to `podman` anyway, and differs from Docker Compose in many
details); every container gets gymflow's labels, limits and isolation and is removed by gymflow's
teardown and reaper; every engine call has a time limit (compose's `up`/`down` can hang with a busy
engine at many rollouts a node); and the rollout's network comes from gymflow's own address pool.

What is read: `image` or `build` (a path, or `{context, dockerfile}`), `command`, `entrypoint`
(strings are split like a shell's words, as Compose does), `environment` (list or map), `env_file`,
`working_dir`, `user`, `hostname`, `restart: "no"`, `healthcheck` (`CMD`, `CMD-SHELL`, `NONE`, a plain
string; interval, timeout, retries, start_period as durations like `1m30s`), `depends_on` (a list,
or a map with `service_started`, `service_healthy`, `service_completed_successfully`), and limits
(`cpus`, `mem_limit`, `pids_limit`, `deploy.resources.limits.{cpus,memory,pids}`). `${VAR}`,
`${VAR:-default}`, `${VAR-default}`, `$VAR` and `$$` are interpolated from a mapping the caller
gives; a variable that is unset and has no default is an error, not an empty string.

Ignored, because they change nothing a rollout can see: `x-*` keys, `version`, `name`, top-level
`networks`/`volumes`, a service's `networks` (every service is on the one rollout network, its name
its address), `container_name`, a build service's `image` (the tag), `pull_policy`, `expose`,
`init`, `tty`, `stdin_open`, `labels`, `logging`, `stop_signal`, `stop_grace_period`, `ulimits`
(gymflow sets nofile itself), `deploy.resources.reservations`, and a named or anonymous volume that
only one service uses (its container's own storage is just as fresh per rollout). Everything else
that would change behaviour (ports, host-path volumes, privileged, network_mode, cap_add, devices,
pid, ipc, extra_hosts, ...) is a `ComposeError` naming the service and the key: gymflow refuses what
it cannot honour rather than run a task differently in silence.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from gymflow.envs.errors import ComposeError
from gymflow.envs.runtime import compose_values as values
from gymflow.envs.runtime.compose_values import COMPOSE_FILE

MAIN_SERVICE = "main"
"""The service the agent runs in (Harbor's name for it)."""

IGNORED_TOP = {"version", "name", "networks", "volumes"}
IGNORED_KEYS = {
    "container_name", "pull_policy", "expose", "init", "tty", "stdin_open", "labels", "logging",
    "stop_signal", "stop_grace_period", "ulimits", "networks",
}  # fmt: skip
HANDLED_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "working_dir", "user", "hostname",
    "restart", "healthcheck", "depends_on", "cpus", "mem_limit", "pids_limit", "deploy", "volumes",
}  # fmt: skip
RESTART_POLICIES = {"no"}
"""The only restart policy: gymflow loads a container's isolation rules once, when it starts."""
_SERVICE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class Condition(enum.StrEnum):
    """What a service waits for in a dependency before it starts."""

    STARTED = "service_started"
    HEALTHY = "service_healthy"
    COMPLETED = "service_completed_successfully"


class Healthcheck(BaseModel):
    """A readiness probe gymflow runs itself (`exec` in the container), the same on both engines."""

    model_config = ConfigDict(frozen=True)

    test: list[str]
    """The argv to run in the container (`CMD-SHELL x` is `/bin/sh -c x`)."""
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0
    """Failures in this first period do not count against `retries`."""


class Build(BaseModel):
    """A build context and its Dockerfile (absolute paths)."""

    model_config = ConfigDict(frozen=True)

    context: Path
    dockerfile: Path


class ServiceLimits(BaseModel):
    """The limits a service asks for; None: gymflow's default."""

    model_config = ConfigDict(frozen=True)

    cpus: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None


class Service(BaseModel):
    """One service of the file, interpolated and checked."""

    model_config = ConfigDict(frozen=True)

    name: str
    image: str | None = None
    build: Build | None = None
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    environment: dict[str, str] = {}
    working_dir: str | None = None
    user: str | None = None
    hostname: str | None = None
    restart: str | None = None
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, Condition] = {}
    limits: ServiceLimits = ServiceLimits()


class ComposeProject(BaseModel):
    """A task's services, with the main one named and a start order that respects `depends_on`."""

    model_config = ConfigDict(frozen=True)

    source: str
    """Where the file came from (for messages)."""
    services: dict[str, Service]
    main: str
    order: list[str]
    """Every service name, each after the services it depends on."""

    @property
    def main_service(self) -> Service:
        return self.services[self.main]

    def sidecars(self) -> list[Service]:
        """The services other than main, in start order."""
        return [self.services[name] for name in self.order if name != self.main]


def load(path: Path, *, variables: Mapping[str, str]) -> ComposeProject:
    """Parse the compose file at `path` (relative paths in it are relative to its directory)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ComposeError(f"{path}: cannot read: {exc}") from exc
    return parse(text, base_dir=path.parent, variables=variables, source=str(path))


def parse(text: str, *, base_dir: Path, variables: Mapping[str, str], source: str = COMPOSE_FILE) -> ComposeProject:
    """Parse and check a compose file's text.

    Args:
        text: The YAML.
        base_dir: The directory relative build contexts and env files resolve against.
        variables: What `${VAR}` interpolates from.
        source: The file's name in messages.

    Raises:
        ComposeError: The file is invalid or uses a key gymflow refuses (the message names it).
    """
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ComposeError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("services"), dict) or not raw["services"]:
        raise ComposeError(f"{source}: needs a `services` map with at least one service")
    for key in raw:
        if key not in IGNORED_TOP and key != "services" and not str(key).startswith("x-"):
            raise ComposeError(f"{source}: top-level key {key!r} is not supported by gymflow")
    tree = values.interpolate_tree(raw["services"], variables, source)
    base = base_dir.resolve()
    volume_users: dict[str, list[str]] = {}
    services: dict[str, Service] = {}
    for name, given in tree.items():
        where = f"{source}: service {name!r}"
        if not isinstance(name, str) or not _SERVICE_NAME.match(name):
            raise ComposeError(f"{where}: a service name must be lowercase letters, digits, '_', '.', '-'")
        body = {} if given is None else given
        if not isinstance(body, dict):
            raise ComposeError(f"{where}: must be a map")
        services[name] = _service(name, body, base, where, volume_users)
    for volume, users in volume_users.items():
        if len(users) > 1:
            raise ComposeError(f"{source}: volume {volume!r} is shared by {', '.join(users)}: not supported by gymflow")
    main = _main(services, base, source)
    if main not in services:
        services[main] = Service(name=main)
    if services[main].image is None and services[main].build is None:
        dockerfile = base / "Dockerfile"
        if not dockerfile.is_file():
            raise ComposeError(f"{source}: service {main!r} has no image or build and {dockerfile} does not exist")
        services[main] = services[main].model_copy(update={"build": Build(context=base, dockerfile=dockerfile)})
    for service in services.values():
        _check_dependencies(service, services, source)
    return ComposeProject(source=source, services=services, main=main, order=dependency_order(services, source))


def dependency_order(services: Mapping[str, Service], source: str = COMPOSE_FILE) -> list[str]:
    """The service names, each after its dependencies (ties in file order); a cycle is an error naming it."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = [*path[path.index(name) :], name]
            raise ComposeError(f"{source}: depends_on has a cycle: {' -> '.join(cycle)}")
        state[name] = "visiting"
        for dep in services[name].depends_on:
            visit(dep, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in services:
        visit(name, [])
    return order


def _service(name: str, body: dict[str, Any], base: Path, where: str, volume_users: dict[str, list[str]]) -> Service:
    for key in body:
        if key not in HANDLED_KEYS and key not in IGNORED_KEYS and not str(key).startswith("x-"):
            raise ComposeError(f"{where}: key {key!r} is not supported by gymflow (it would change how the task runs)")
    if "image" in body and not isinstance(body["image"], str):
        raise ComposeError(f"{where}: `image` must be a string")
    build = _build(body["build"], base, f"{where}: build") if "build" in body else None
    restart = "no" if body.get("restart") is False else body.get("restart")  # YAML reads a bare `no` as false
    if restart is not None and str(restart) not in RESTART_POLICIES:
        raise ComposeError(
            f"{where}: restart {restart!r} is not supported by gymflow (a restarted container would come back "
            'without its network\'s isolation rules): leave it out or write restart: "no"'
        )
    env = values.env_files(body.get("env_file"), base, f"{where}: env_file")
    env.update(values.environment(body.get("environment"), f"{where}: environment"))
    for entry in body.get("volumes") or []:
        volume = values.volume_source(entry, f"{where}: volumes")
        if volume is not None:
            volume_users.setdefault(volume, []).append(name)
    return Service(
        name=name,
        image=None if build else body.get("image"),
        build=build,
        command=values.argv(body.get("command"), f"{where}: command"),
        entrypoint=values.argv(body.get("entrypoint"), f"{where}: entrypoint"),
        environment=env,
        working_dir=_optional_str(body.get("working_dir")),
        user=_optional_str(body.get("user")),
        hostname=_optional_str(body.get("hostname")),
        restart=None if restart is None else str(restart),
        healthcheck=_healthcheck(body.get("healthcheck"), f"{where}: healthcheck"),
        depends_on=_depends_on(body.get("depends_on"), f"{where}: depends_on"),
        limits=_limits(body, where),
    )


def _main(services: dict[str, Service], base: Path, source: str) -> str:
    if MAIN_SERVICE in services:
        return MAIN_SERVICE
    from_here = [s.name for s in services.values() if s.build is not None and s.build.context == base]
    if len(from_here) == 1:
        return from_here[0]
    if len(from_here) > 1:
        raise ComposeError(f"{source}: no `main` service, and several are built from '.': {', '.join(from_here)}")
    return MAIN_SERVICE  # Harbor's base file adds it: built from this directory


def _check_dependencies(service: Service, services: dict[str, Service], source: str) -> None:
    for dep, condition in service.depends_on.items():
        where = f"{source}: service {service.name!r}: depends_on {dep!r}"
        if dep not in services:
            raise ComposeError(f"{where}: no such service")
        if condition is Condition.HEALTHY and services[dep].healthcheck is None:
            raise ComposeError(f"{where}: service_healthy, but {dep!r} has no healthcheck")


def _build(value: object, base: Path, where: str) -> Build:
    if isinstance(value, str):
        value = {"context": value}
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: must be a path or a map with `context`")
    extra = set(value) - {"context", "dockerfile"}
    if extra:
        raise ComposeError(f"{where}: key {sorted(extra)[0]!r} is not supported by gymflow")
    context = (base / str(value.get("context", "."))).resolve()
    dockerfile = (context / str(value.get("dockerfile", "Dockerfile"))).resolve()
    if not context.is_dir():
        raise ComposeError(f"{where}: context {context} is not a directory")
    if not dockerfile.is_file():
        raise ComposeError(f"{where}: dockerfile {dockerfile} does not exist")
    return Build(context=context, dockerfile=dockerfile)


def _healthcheck(value: object, where: str) -> Healthcheck | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: must be a map")
    extra = set(value) - {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}
    if extra:
        raise ComposeError(f"{where}: key {sorted(extra)[0]!r} is not supported by gymflow")
    test = value.get("test")
    if value.get("disable") or test in (["NONE"], "NONE"):
        return None
    if isinstance(test, str):
        argv = ["/bin/sh", "-c", test]
    elif isinstance(test, list) and test and test[0] == "CMD" and len(test) > 1:
        argv = [str(t) for t in test[1:]]
    elif isinstance(test, list) and len(test) == 2 and test[0] == "CMD-SHELL":
        argv = ["/bin/sh", "-c", str(test[1])]
    else:
        raise ComposeError(f"{where}: test must be a string, [CMD, ...], [CMD-SHELL, cmd] or [NONE]")
    retries = value.get("retries", 3)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
        raise ComposeError(f"{where}: retries must be a positive integer")
    times = {
        k: values.parse_duration(value[k], where=f"{where}: {k}")
        for k in ("interval", "timeout", "start_period")
        if k in value
    }
    return Healthcheck(
        test=argv,
        interval_s=times.get("interval", 30.0) or 30.0,
        timeout_s=times.get("timeout", 30.0) or 30.0,
        retries=retries,
        start_period_s=times.get("start_period", 0.0),
    )


def _depends_on(value: object, where: str) -> dict[str, Condition]:
    if value is None:
        return {}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return dict.fromkeys(value, Condition.STARTED)
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: must be a list of services or a map")
    deps = {}
    for dep, given in value.items():
        spec = given or {}
        extra = set(spec) - {"condition", "required", "restart"} if isinstance(spec, dict) else {"?"}
        if extra or spec.get("required") is False:
            raise ComposeError(f"{where}: {dep!r}: only `condition` is supported by gymflow")
        try:
            deps[str(dep)] = Condition(spec.get("condition", Condition.STARTED))
        except ValueError:
            raise ComposeError(f"{where}: {dep!r}: unknown condition {spec.get('condition')!r}") from None
    return deps


def _limits(body: dict[str, Any], where: str) -> ServiceLimits:
    deploy = body.get("deploy") or {}
    if not isinstance(deploy, dict) or set(deploy) - {"resources"}:
        raise ComposeError(f"{where}: deploy: only `resources` is supported by gymflow")
    resources = deploy.get("resources") or {}
    if not isinstance(resources, dict) or set(resources) - {"limits", "reservations"}:
        raise ComposeError(f"{where}: deploy.resources: only `limits` and `reservations` are supported")
    limits = resources.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - {"cpus", "memory", "pids"}:
        raise ComposeError(f"{where}: deploy.resources.limits: only cpus, memory and pids are supported")
    cpus, memory, pids = body.get("cpus", limits.get("cpus")), body.get("mem_limit", limits.get("memory")), None
    pids = body.get("pids_limit", limits.get("pids"))
    try:
        return ServiceLimits(
            cpus=None if cpus is None else float(cpus),
            memory_bytes=None if memory is None else values.parse_bytes(memory, where=f"{where}: memory"),
            pids=None if pids is None else int(pids),
        )
    except (TypeError, ValueError) as exc:
        raise ComposeError(f"{where}: a limit is not a number: {exc}") from None


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)
