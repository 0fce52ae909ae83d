"""A rollout's services on real engines (gymflow.envs.runtime.services and network), podman and docker.

Each engine is skipped when its daemon does not answer, unless `GYMFLOW_CONTAINER_TEST_REQUIRE`
(podman) or `GYMFLOW_DOCKER_TEST_REQUIRE` (docker) is set: then the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import figures
import pytest

from gymflow.envs.errors import EngineError, EngineUnavailable, SandboxError
from gymflow.envs.runtime.compose import ComposeProject, parse
from gymflow.envs.runtime.engine import LABEL_MARKER, LABEL_NODE, LABEL_OWNER, LABEL_ROLLOUT, Engine
from gymflow.envs.runtime.network import create_network, networks, remove_networks
from gymflow.envs.runtime.services import ServiceGroup

IMAGE = "debian:bookworm-slim"
STATE_DIR = Path("/var/tmp/gymflow-test-services")
REQUIRE = {"podman": "GYMFLOW_CONTAINER_TEST_REQUIRE", "docker": "GYMFLOW_DOCKER_TEST_REQUIRE"}
# A TCP server in the image's perl-base (it has no nc, python or busybox): greets each client.
LISTENER = (
    "use IO::Socket::INET; $|=1; my $s = IO::Socket::INET->new(LocalPort => 5432, Listen => 16, ReuseAddr => 1)"
    " or die $!; print qq(listening\\n); while (my $c = $s->accept) { print $c qq(hello\\n); close $c }"
)
COMPOSE = f"""
services:
  main:
    image: {IMAGE}
    depends_on:
      db: {{condition: service_healthy}}
  db:
    image: {IMAGE}
    command: ["perl", "-e", {json.dumps(LISTENER.replace("$", "$$"))}]
    healthcheck:
      test: ["CMD", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/5432"]
      interval: 200ms
      timeout: 5s
      retries: 50
"""
WITH_INIT = (
    COMPOSE.replace(
        "db: {condition: service_healthy}",
        "db: {condition: service_healthy}\n      init: {condition: service_completed_successfully}",
    )
    + f"""  init:
    image: {IMAGE}
    depends_on: {{db: {{condition: service_healthy}}}}
    entrypoint: ["bash", "-c"]
    command: ["exec 3<>/dev/tcp/db/5432"]
"""
)
FAILING = f"""
services:
  main: {{image: {IMAGE}}}
  bad:
    image: {IMAGE}
    command: ["bash", "-c", "echo boom-marker; exec sleep infinity"]
    healthcheck: {{test: ["CMD", "false"], interval: 100ms, timeout: 5s, retries: 2}}
"""


@pytest.fixture(params=["podman", "docker"])
async def engine(request: pytest.FixtureRequest) -> Engine:
    kind: str = request.param
    problem = ""
    try:
        found = Engine.detect(kind)
        await found.run(["info"], timeout_s=30)
        if not await found.image_exists(IMAGE):
            problem = f"{IMAGE} is not on this machine"
    except (EngineError, EngineUnavailable) as exc:
        problem = str(exc)
    if problem and os.environ.get(REQUIRE[kind]):
        pytest.fail(f"{kind} does not answer ({REQUIRE[kind]} is set): {problem}")
    if problem:
        pytest.skip(f"{kind} does not answer: {problem}")
    return found


def rollout_labels() -> dict[str, str]:
    return {LABEL_NODE: f"test-{uuid.uuid4().hex[:8]}", LABEL_ROLLOUT: uuid.uuid4().hex[:12], LABEL_OWNER: "test"}


def project(text: str, tmp_path: Path) -> ComposeProject:
    return parse(text, base_dir=tmp_path, variables={})


@contextlib.asynccontextmanager
async def main_container(engine: Engine, group: ServiceGroup, *, isolate: bool = True) -> AsyncIterator[str]:
    """The main container as the runtime would start it: joined with `main_flags`, then isolated."""
    name = f"gymflow-{uuid.uuid4().hex[:12]}"
    labels = [arg for k, v in group.labels.items() for arg in ("--label", f"{k}={v}")]
    try:
        args = ["run", "-d", "--name", name, *engine.run_flags(), "--init", "--ulimit", "nproc=256:256", *labels]
        flags = group.main_flags()
        if not isolate:  # a second container beside main: the network's last address
            assert group.network is not None
            flags[flags.index("--ip") + 1] = str(list(group.network.addresses())[-1])
        args += flags
        await engine.run([*args, IMAGE, "sleep", "infinity"], timeout_s=60)
        if isolate:
            pid = await engine.run(["inspect", "--format", "{{.State.Pid}}", name], timeout_s=30)
            await group.isolate(int(pid.stdout.strip()))
        yield name
    finally:
        await engine.remove([name])


async def connect(engine: Engine, container: str, host: str, port: int) -> str:
    """What a TCP client in `container` gets from host:port: its first line, or `refused: ...`."""
    script = f"exec 3<>/dev/tcp/{host}/{port} || exit 7; timeout 5 head -n1 <&3"
    done = await engine.run(["exec", container, "timeout", "10", "bash", "-c", script], timeout_s=30, check=False)
    return done.stdout.strip() if done.returncode == 0 else f"refused: {done.returncode} {done.stderr.strip()[-200:]}"


async def leftovers(engine: Engine, labels: dict[str, str]) -> list[str]:
    found = [c.name for c in await engine.containers({LABEL_MARKER: "1", **labels})]
    return found + [n.name for n in await networks(engine, {LABEL_MARKER: "1", **labels})]


@pytest.mark.timeout(240)
async def test_service_reachable_by_name_and_isolated(engine: Engine, tmp_path: Path) -> None:
    """(a) main reaches db by name after its healthcheck; (b) another rollout's main does not, nor the host."""
    host_hits: list[str] = []

    async def on_host(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host_hits.append("hit")
        writer.write(b"host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_host, "0.0.0.0", 0)
    host_port = server.sockets[0].getsockname()[1]
    first_labels, second_labels = rollout_labels(), rollout_labels()
    first = ServiceGroup(engine, project(COMPOSE, tmp_path), labels=first_labels, state_dir=STATE_DIR)
    second = ServiceGroup(engine, project(COMPOSE, tmp_path), labels=second_labels, state_dir=STATE_DIR)
    try:
        started = time.monotonic()
        await asyncio.gather(first.start(), second.start())
        figures.record("services", f"{engine.kind}: two rollouts' db started and healthy (concurrently)",
                       seconds=round(time.monotonic() - started, 2))  # fmt: skip
        assert first.network is not None and second.network is not None
        db_of_first = str(first.addresses["db"])
        async with main_container(engine, first) as main1, main_container(engine, second) as main2:
            assert await connect(engine, main1, "db", 5432) == "hello"
            assert await connect(engine, main2, "db", 5432) == "hello"  # its own db, by the same name
            assert (await connect(engine, main2, db_of_first, 5432)).startswith("refused")
            assert (await connect(engine, main1, str(first.network.gateway), host_port)).startswith("refused")
            async with main_container(engine, first, isolate=False) as bare:  # the control: rules matter
                assert await connect(engine, bare, str(first.network.gateway), host_port) == "host"
        assert host_hits == ["hit"]
    finally:
        server.close()
        for group in (first, second):
            await group.close()
    for labels in (first_labels, second_labels):
        assert await leftovers(engine, labels) == []


@pytest.mark.timeout(120)
async def test_failing_healthcheck_names_service_and_leaves_nothing(engine: Engine, tmp_path: Path) -> None:
    """(d) a healthcheck that never passes: SandboxError with the service and its log; nothing left."""
    labels = rollout_labels()
    group = ServiceGroup(engine, project(FAILING, tmp_path), labels=labels, state_dir=STATE_DIR)
    with pytest.raises(SandboxError) as caught:
        await group.start()
    message = str(caught.value)
    assert "'bad'" in message and "healthcheck" in message and "boom-marker" in message
    assert await leftovers(engine, labels) == []
    await group.close()  # idempotent after a failed start


@pytest.mark.timeout(120)
async def test_close_removes_everything(engine: Engine, tmp_path: Path) -> None:
    """(d) close() after a start leaves no container or network with the rollout's labels; twice is fine.

    Main waits for an init service that reaches db by name and exits 0 (service_completed_successfully).
    """
    labels = rollout_labels()
    group = ServiceGroup(engine, project(WITH_INIT, tmp_path), labels=labels, state_dir=STATE_DIR)
    await group.start()
    assert len(await leftovers(engine, labels)) == 3  # db, init (exited 0) and the network
    await group.close()
    await group.close()
    assert await leftovers(engine, labels) == []


@pytest.mark.slow  # about 20-35 s an engine here: the engines create networks one at a time
@pytest.mark.timeout(300)
async def test_64_networks_concurrently(engine: Engine) -> None:
    """(c) 64 rollout networks at once from the pool: distinct subnets, none exhausts the engine's pools."""
    labels = rollout_labels()
    started = time.monotonic()
    one = await create_network(engine, labels=labels)
    single_s = time.monotonic() - started
    created = [one]
    try:
        started = time.monotonic()
        created += await asyncio.gather(*(create_network(engine, labels=labels) for _ in range(63)))
        many_s = time.monotonic() - started
        assert len({n.subnet for n in created}) == 64
        assert len(await networks(engine, {LABEL_MARKER: "1", **labels})) == 64
    finally:
        started = time.monotonic()
        await remove_networks(engine, [n.name for n in created])
        removed_s = time.monotonic() - started
    figures.record("services", f"{engine.kind}: rollout networks", one_create_s=round(single_s, 2),
                   create_63_concurrently_s=round(many_s, 2), remove_64_s=round(removed_s, 2))  # fmt: skip
    print(f"{engine.kind}: 1 network {single_s:.2f}s; 63 more concurrently {many_s:.2f}s; 64 removed {removed_s:.2f}s")
    assert await networks(engine, {LABEL_MARKER: "1", **labels}) == []
