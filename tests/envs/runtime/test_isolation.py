"""Isolation from inside a rollout's container: every escape attempt must fail, and the box must survive it."""

from __future__ import annotations

import asyncio
import ipaddress
import uuid
from pathlib import Path

import pytest
from container_support import leftovers
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError

from gymflow.envs.errors import SandboxError
from gymflow.envs.runtime import egress
from gymflow.envs.runtime.base import Limits, RolloutSpec
from gymflow.envs.runtime.container import ContainerRuntime, ContainerSandbox
from gymflow.envs.runtime.diskwatch import DiskCapUnavailable
from gymflow.envs.runtime.terminal import build_server
from gymflow.envs.runtime.terminal import report as terminal_report

LIMITS = Limits(cpus=1, memory_mb=128, storage_mb=96, pids=64)


async def start(runtime: ContainerRuntime, image: str, tmp_path: Path) -> ContainerSandbox:
    rollout = uuid.uuid4().hex[:8]
    spec = RolloutSpec(
        rollout_id=rollout, node_id=runtime.node_id, workspace=str(tmp_path / rollout), limits=LIMITS, image=image,
        workdir="/app", workspace_mount="/logs",
    )  # fmt: skip
    return await runtime.start(spec)


async def test_host_loopback_ports_are_unreachable(runtime: ContainerRuntime, base_image: str, tmp_path: Path) -> None:
    connected = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sandbox = await start(runtime, base_image, tmp_path)
    try:
        inside = await sandbox.exec(
            ["bash", "-c", f"(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo reached || echo refused"], timeout_s=30
        )
        assert "refused" in inside.stdout + inside.stderr and not connected.is_set()
        for host in ("127.0.0.1", "localhost", "127.0.0.2"):
            done = await sandbox.exec(["bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"], timeout_s=30)
            assert done.exit_code != 0
        assert not connected.is_set(), "a container reached a port on the host's loopback"
    finally:
        await sandbox.release()
        server.close()
        await server.wait_closed()


async def test_no_network_but_its_own_loopback(runtime: ContainerRuntime, base_image: str, tmp_path: Path) -> None:
    sandbox = await start(runtime, base_image, tmp_path)
    try:
        interfaces = await sandbox.exec(
            ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"], timeout_s=30
        )
        assert interfaces.stdout.split() == ["lo"]
        routes = await sandbox.exec(["sh", "-c", "tail -n +2 /proc/net/route"], timeout_s=30)
        assert routes.stdout.strip() == ""
        # Debian's mirror, which the host (and image builds) reach, is out of reach from a rollout.
        apt = await sandbox.exec(["sh", "-c", "apt-get -o Acquire::Retries=0 update 2>&1"], timeout_s=120)
        assert apt.exit_code != 0 or "Err:" in apt.stdout or "W: " in apt.stdout
        assert "Hit:" not in apt.stdout and "Get:" not in apt.stdout
    finally:
        await sandbox.release()


async def test_another_rollouts_container_and_workspace_are_out_of_reach(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    first, second = await start(runtime, base_image, tmp_path), await start(runtime, base_image, tmp_path)
    try:
        secret = uuid.uuid4().hex
        (second.workspace / "secret.txt").write_text(secret)
        await second.exec(["sh", "-c", "nohup sleep 31337 >/dev/null 2>&1 &"], timeout_s=30)
        half = len(secret) // 2  # the probe's own command line must not hold the whole secret
        found = await first.exec(
            [
                "sh",
                "-c",
                f'grep -rl "{secret[:half]}""{secret[half:]}" / --exclude-dir=proc --exclude-dir=sys 2>/dev/null',
            ],
            timeout_s=120,
        )
        assert found.stdout == "", f"another rollout's file is readable: {found.stdout}"
        paths = await first.exec(["sh", "-c", f"ls {second.workspace} {second.disk.path} 2>&1"], timeout_s=30)
        assert paths.stdout.count("No such file") == 2  # neither its workspace's host path nor its disk exists here
        processes = await first.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], timeout_s=30)
        assert "31337" not in processes.stdout, "a container sees another container's processes"
        own = await second.exec(["cat", "/logs/secret.txt"], timeout_s=30)
        assert own.stdout == secret
    finally:
        await first.release()
        await second.release()


async def test_memory_hog_is_killed_and_reported_as_a_tool_error(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    sandbox = await start(runtime, base_image, tmp_path)
    try:
        async with Client(build_server(sandbox, memory_mb=LIMITS.memory_mb)) as client:
            hog = await client.call_tool("bash", {"command": 'x=$(head -c 400M /dev/zero | tr "\\0" a); echo ${#x}'})
            assert hog.is_error
            text = hog.content[0].text  # type: ignore[union-attr]
            assert "out of memory (128 MB)" in text
            after = await client.call_tool("bash", {"command": "echo still-alive"})
            assert not after.is_error and "still-alive" in after.content[0].text  # type: ignore[union-attr]
        # conmon marks an OOM-killed exec with a file `oom` in its client's working directory: never ours.
        assert not (Path.cwd() / "oom").exists()
    finally:
        await sandbox.release()


def pids_files(sandbox: ContainerSandbox) -> tuple[Path, Path]:
    """The container's pids cgroup counters, read from the host (forking inside fails at the limit)."""
    relative = sandbox.executor.cgroup.lstrip("/")
    for base in (Path("/sys/fs/cgroup/pids") / relative, Path("/sys/fs/cgroup") / relative):
        if (base / "pids.current").exists():
            return base / "pids.current", base / "pids.events"
    raise AssertionError(f"no pids cgroup for {sandbox.executor.cgroup}")


@pytest.mark.heavy
async def test_fork_bomb_is_contained_by_the_pids_limit(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    sandbox = await start(runtime, base_image, tmp_path)
    current, events = pids_files(sandbox)
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, int(current.read_text()))
            await asyncio.sleep(0.02)  # a sampling period, not a wait for an event

    try:
        # Bounded first: 200 sleepers asked for; the cgroup never holds more than the limit (64).
        sampler = asyncio.create_task(sample())
        await sandbox.exec(["bash", "-c", "for i in {1..200}; do sleep 300 & done; wait"], timeout_s=5)
        sampling = False
        await sampler
        rejected = int(events.read_text().split()[-1])
        # Forks past pids.max are refused; processes *attached* by `podman exec` are not counted against
        # it by the kernel (a migration, not a fork), so the count may pass the limit by those few.
        assert int((current.parent / "pids.max").read_text()) == LIMITS.pids
        assert 0 < peak <= LIMITS.pids + 8 and rejected > 0, (peak, rejected)
        # Then a real fork bomb through the terminal tool: it stays under the limit, the timeout kills its
        # process group (from the host: the container has no pid left for a `kill`), the container answers.
        peak, sampling = 0, True
        sampler = asyncio.create_task(sample())
        async with Client(build_server(sandbox)) as client:
            bomb = await client.call_tool("bash", {"command": "bomb() { bomb | bomb & }; bomb; sleep 60", "timeout": 5})
            sampling = False
            await sampler
            assert peak <= LIMITS.pids + 8, peak
            assert bomb.is_error and "timed out" in bomb.content[0].text  # type: ignore[union-attr]
            alive = await client.call_tool("bash", {"command": "echo alive", "timeout": 60})
            assert "alive" in alive.content[0].text  # type: ignore[union-attr]
        assert int(current.read_text()) < 10
    finally:
        sampling = False
        await sandbox.release()


async def test_disk_filler_stops_at_storage_mb(runtime: ContainerRuntime, base_image: str, tmp_path: Path) -> None:
    if not (await runtime.disk_guarantee(base_image)).hard:
        pytest.skip("this engine only watches the disk: test_a_watched_disk_filler_is_stopped_and_reported")
    sandbox = await start(runtime, base_image, tmp_path)
    try:
        for target in ("/app/fill", "/tmp/fill", "/logs/fill"):  # the root filesystem, and the workspace mount
            done = await sandbox.exec(
                ["sh", "-c", f"dd if=/dev/zero of={target} bs=1M count=1000 2>&1; rm -f {target}"], timeout_s=120
            )
            assert "No space left on device" in done.stdout
            written = int(done.stdout.split(" bytes")[0].rsplit("\n", 1)[-1])
            assert written <= LIMITS.storage_mb * 1024 * 1024
        # On the host the container's writes occupy its disk image alone, at most storage_mb.
        assert sandbox.disk.image.stat().st_blocks * 512 <= LIMITS.storage_mb * 1024 * 1024
    finally:
        await sandbox.release()


async def test_an_egress_allowlist_reaches_what_it_lists_and_nothing_else(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    if missing := egress.missing_tools():
        pytest.skip(f"no {', '.join(missing)} on this node: {egress.INSTALL_HINT}")
    reached: list[int] = []

    async def serve() -> tuple[asyncio.Server, int]:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            reached.append(writer.get_extra_info("sockname")[1])
            writer.write(b"hello\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(on_connect, "0.0.0.0", 0)
        return server, server.sockets[0].getsockname()[1]

    (allowed_server, allowed), (other_server, other) = await serve(), await serve()
    if runtime.engine.kind == "podman":
        fmt = "{{range .Subnets}}{{.Gateway}}{{end}}"
        gateway = (await runtime.engine.run(["network", "inspect", "podman", "--format", fmt])).stdout.strip()
    else:  # docker's default bridge names only its subnet; the host holds the subnet's first address
        fmt = "{{range .IPAM.Config}}{{.Subnet}}{{end}}"
        subnet = (await runtime.engine.run(["network", "inspect", "bridge", "--format", fmt])).stdout.strip()
        gateway = str(next(ipaddress.ip_network(subnet).hosts()))
    # gateway: the host, as containers on the engine's network see it
    rollout = uuid.uuid4().hex[:8]
    limits = LIMITS.model_copy(update={"network_allow": [f"{gateway}:{allowed}"]})
    spec = RolloutSpec(
        rollout_id=rollout, node_id=runtime.node_id, workspace=str(tmp_path / rollout), limits=limits,
        image=base_image, workdir="/app", workspace_mount="/logs",
    )  # fmt: skip
    sandbox = await runtime.start(spec)
    try:
        ok = await sandbox.exec(["bash", "-c", f"exec 3<>/dev/tcp/{gateway}/{allowed}; head -1 <&3"], timeout_s=30)
        assert ok.exit_code == 0 and ok.stdout.strip() == "hello", ok
        for target in (f"{gateway}/{other}", "151.101.2.132/80", "10.255.255.53/53", f"127.0.0.1/{allowed}"):
            refused = await sandbox.exec(["bash", "-c", f"exec 3<>/dev/tcp/{target}"], timeout_s=30)
            assert refused.exit_code != 0 and not refused.timed_out, (target, refused)
        assert other not in reached
        # The rules belong to the container's namespace, which it cannot change (no CAP_NET_ADMIN).
        caps = await sandbox.exec(["sh", "-c", "grep CapEff /proc/self/status"], timeout_s=30)
        assert not int(caps.stdout.split()[1], 16) & (1 << 12)  # CAP_NET_ADMIN
    finally:
        await sandbox.release()
        for server in (allowed_server, other_server):
            server.close()
            await server.wait_closed()


def test_an_allowlist_entry_is_checked_when_read() -> None:
    with pytest.raises(ValueError, match="not host or host:port"):
        Limits(network_allow=["example.org:http"])
    with pytest.raises(ValueError, match="not both"):
        Limits(network=True, network_allow=["10.0.0.1"])


async def test_allowlist_names_resolve_on_the_worker_into_the_containers_hosts() -> None:
    destinations = await egress.resolve(["localhost:8080", "10.1.2.3"])
    assert egress.Destination("127.0.0.1", 8080, name="localhost") in destinations
    assert egress.Destination("10.1.2.3", None) in destinations
    assert egress.host_flags(destinations) == ["--add-host", "localhost:127.0.0.1"]
    assert "-A OUTPUT -d 10.1.2.3/32 -p tcp -j ACCEPT" in egress.rules(destinations).splitlines()
    with pytest.raises(SandboxError, match=r"cannot resolve 'no-such-host\.invalid'"):
        await egress.resolve(["no-such-host.invalid:443"])


async def test_a_watched_disk_filler_is_stopped_and_reported(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    """Docker on ext4: the workspace still fails at the cap; a write past it anywhere else kills the
    container, and the command (and every later one) reports it: a tool error the model sees."""
    if (await runtime.disk_guarantee(base_image)).hard:
        pytest.skip("this engine caps every write: test_disk_filler_stops_at_storage_mb")
    sandbox = await start(runtime, base_image, tmp_path)
    try:
        fill = "dd if=/dev/zero of=/logs/fill bs=1M count=1000 2>&1; rm -f /logs/fill"
        done = await sandbox.exec(["sh", "-c", fill], timeout_s=120)
        assert "No space left on device" in done.stdout and not done.disk_exceeded  # the workspace: hard
        slow = "while true; do dd if=/dev/zero bs=1M count=8 2>/dev/null >> /app/fill; sleep 0.05; done"
        done = await sandbox.exec(["sh", "-c", slow], timeout_s=120)
        assert done.disk_exceeded and not done.timed_out, done
        assert f"past its disk cap of {LIMITS.storage_mb} MB" in done.stderr
        later = await sandbox.exec(["true"], timeout_s=30)
        assert later.disk_exceeded and later.exit_code is None
        with pytest.raises(ToolError, match="passed the disk cap"):
            terminal_report(later, 30, None)
        assert not await sandbox.running()
    finally:
        await sandbox.release()


async def test_a_task_needing_a_hard_disk_cap_is_refused_where_the_disk_is_only_watched(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    limits = LIMITS.model_copy(update={"storage_hard": True})
    spec = RolloutSpec(
        rollout_id="hard", node_id=runtime.node_id, workspace=str(tmp_path / "hard"), limits=limits,
        image=base_image, workdir="/app", workspace_mount="/logs",
    )  # fmt: skip
    if (await runtime.disk_guarantee(base_image)).hard:
        sandbox = await runtime.start(spec)  # podman: every write is capped, the task runs
        await sandbox.release()
        return
    with pytest.raises(DiskCapUnavailable, match="storage_hard") as refused:
        await runtime.start(spec)
    assert isinstance(refused.value, SandboxError)  # infra: the rollout is flagged, never scored
    assert runtime.live() == [] and await leftovers(runtime.engine, runtime.node_id) == []
