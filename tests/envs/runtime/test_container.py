"""The container runtime on a real podman: exec, timeouts, output caps, files, the warm pool, the reaper."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from container_support import STATE_ROOT, leftovers

from gymflow.envs.runtime.base import Limits, RolloutSpec
from gymflow.envs.runtime.container import ContainerRuntime
from gymflow.envs.runtime.reaper import node_containers, orphans, reap

LIMITS = Limits(cpus=1, memory_mb=256, storage_mb=128, pids=64)


def spec(
    runtime: ContainerRuntime, image: str, tmp_path: Path, rollout: str | None = None, **kw: object
) -> RolloutSpec:
    rollout = rollout or uuid.uuid4().hex[:8]
    return RolloutSpec(
        rollout_id=rollout,
        node_id=runtime.node_id,
        workspace=str(tmp_path / f"ws-{rollout}"),
        limits=LIMITS,
        image=image,
        workdir="/app",
        **kw,  # type: ignore[arg-type]
    )


async def test_exec_runs_in_the_workdir_with_stdin_and_exit_codes(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    sandbox = await runtime.start(spec(runtime, base_image, tmp_path, env={"GREETING": "hi"}))
    try:
        done = await sandbox.exec(["sh", "-c", 'pwd; echo "$GREETING"; echo oops >&2; exit 3'], timeout_s=30)
        assert (done.exit_code, done.stdout, done.stderr, done.timed_out) == (3, "/app\nhi\n", "oops\n", False)
        piped = await sandbox.exec(["wc", "-c"], stdin=b"x" * 100_000, timeout_s=30)
        assert piped.stdout.strip() == "100000"
        missing = await sandbox.exec(["no-such-program"], timeout_s=30)
        assert missing.exit_code == 127 and "not found" in missing.stderr
    finally:
        await sandbox.release()


async def test_a_timeout_kills_the_command_and_what_it_started(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    sandbox = await runtime.start(spec(runtime, base_image, tmp_path))
    try:
        started = time.monotonic()
        done = await sandbox.exec(["sh", "-c", "sleep 4242 & sleep 4343"], timeout_s=1)
        assert done.timed_out and done.exit_code is None
        assert time.monotonic() - started < 15
        survivors = await sandbox.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], timeout_s=30)
        assert "4242" not in survivors.stdout and "4343" not in survivors.stdout
    finally:
        await sandbox.release()


async def test_output_is_capped_keeping_start_and_end(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    sandbox = await runtime.start(spec(runtime, base_image, tmp_path))
    try:
        done = await sandbox.exec(
            ["sh", "-c", "echo FIRST; head -c 5000000 /dev/zero | tr '\\0' x; echo; echo LAST"],
            timeout_s=60,
            max_output_bytes=1000,
        )
        assert done.exit_code == 0 and done.truncated
        assert done.stdout.startswith("FIRST") and done.stdout.rstrip().endswith("LAST")
        assert "bytes of output omitted" in done.stdout and len(done.stdout) < 2000
    finally:
        await sandbox.release()


async def test_workspace_files_and_copies(runtime: ContainerRuntime, base_image: str, tmp_path: Path) -> None:
    sandbox = await runtime.start(spec(runtime, base_image, tmp_path))
    try:
        (sandbox.workspace / "from-host.txt").write_text("host")
        seen = await sandbox.exec(["cat", "/workspace/from-host.txt"], timeout_s=30)
        assert seen.stdout == "host"
        source = tmp_path / "tree"
        (source / "sub").mkdir(parents=True)
        (source / "sub" / "f.txt").write_text("copied")
        await sandbox.copy_in(source, "/opt/tree")
        assert (await sandbox.exec(["cat", "/opt/tree/sub/f.txt"], timeout_s=30)).stdout == "copied"
        await sandbox.copy_out("/opt/tree/sub/f.txt", tmp_path / "out" / "f.txt")
        assert (tmp_path / "out" / "f.txt").read_text() == "copied"
    finally:
        await sandbox.release()
    assert not sandbox.disk.path.exists()


async def test_stdio_command_is_a_plain_pipe_into_the_container(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    sandbox = await runtime.start(spec(runtime, base_image, tmp_path))
    try:
        command = sandbox.stdio_command(["sh", "-c", 'while read -r line; do echo "in-container:$line"; done'])
        process = await asyncio.create_subprocess_exec(
            *command.argv, env=command.env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdin is not None and process.stdout is not None
        for message in ('{"jsonrpc": "2.0", "id": 1}', '{"jsonrpc": "2.0", "id": 2}'):
            process.stdin.write(message.encode() + b"\n")
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            assert line.decode() == f"in-container:{message}\n"
        process.stdin.close()
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        await sandbox.release()


async def test_warm_pool_hands_each_container_to_one_rollout(base_image: str, tmp_path: Path) -> None:
    node = f"test-{uuid.uuid4().hex[:8]}"
    runtime = ContainerRuntime(node_id=node, state_root=STATE_ROOT, pool_size=2)
    try:
        template = spec(runtime, base_image, tmp_path, rollout="template")
        await runtime.warm(template)
        assert runtime.ready(template) == 2
        started = time.monotonic()
        first = await runtime.start(spec(runtime, base_image, tmp_path, rollout="r-1"))
        warm_start = time.monotonic() - started
        second = await runtime.start(spec(runtime, base_image, tmp_path, rollout="r-2"))
        third = await runtime.start(spec(runtime, base_image, tmp_path, rollout="r-3"))
        names = {first.name, second.name, third.name}
        assert len(names) == 3, "a pooled container was handed out twice"
        assert warm_start < 0.2, f"a warm start took {warm_start:.3f}s"
        listed = {c.name: c.rollout_id for c in await node_containers(runtime.engine, node)}
        assert listed[first.name] == "r-1" and listed[second.name] == "r-2" and listed[third.name] == "r-3"
        await runtime.warm(template)  # refilled in the background after each take
        assert runtime.ready(template) == 2
        for sandbox in (first, second, third):
            await sandbox.release()
        assert {c.name for c in await node_containers(runtime.engine, node)}.isdisjoint(names)
    finally:
        await runtime.close()
    assert await leftovers(runtime.engine, node) == []


async def test_reaper_removes_what_a_dead_worker_left(base_image: str, tmp_path: Path) -> None:
    node = f"test-{uuid.uuid4().hex[:8]}"
    crashed = ContainerRuntime(node_id=node, state_root=STATE_ROOT, pool_size=1)
    kept = await crashed.start(spec(crashed, base_image, tmp_path, rollout="live"))
    await crashed.start(spec(crashed, base_image, tmp_path, rollout="terminated"))
    await crashed.warm(spec(crashed, base_image, tmp_path, rollout="template"))
    # The same worker still alive: only the rollout that is no longer live is an orphan.
    assert {
        c.rollout_id for c in await orphans(crashed.engine, node_id=node, live_rollouts={"live"}, owner=crashed.owner)
    } == {"terminated"}
    # The worker "dies" (its runtime object is dropped, nothing released); a new one takes the node.
    successor = ContainerRuntime(node_id=node, state_root=STATE_ROOT)
    removed = await reap(
        successor.engine, node_id=node, state_root=STATE_ROOT, live_rollouts={"live"}, owner=successor.owner
    )
    assert len(removed) == 3
    assert await leftovers(successor.engine, node) == []
    assert not kept.disk.path.exists() and not kept.disk.root.is_mount()
    await successor.close()
    await crashed.close()


def test_a_docker_cli_without_a_daemon_is_no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gymflow.envs.errors import EngineUnavailable
    from gymflow.envs.runtime.engine import Engine

    fake = tmp_path / "docker"  # a client that reaches no daemon, as on a machine with the CLI alone
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///nowhere.sock.' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(EngineUnavailable, match="reaches no daemon") as refused:
        Engine.detect(str(fake))
    assert "start dockerd" in str(refused.value)
    monkeypatch.setenv("PATH", str(tmp_path))  # auto: no podman, and a silent docker is no engine either
    with pytest.raises(EngineUnavailable, match="reaches no daemon"):
        Engine.detect()


async def test_envs_show_says_which_engine_and_disk_cap_the_node_gives(runtime: ContainerRuntime) -> None:
    from gymflow.envs.catalog import describe
    from gymflow.envs.runtime.diskwatch import node_guarantee
    from gymflow.workers.cli.envs import render_env

    shown = render_env(await describe("harbor"))
    guarantee = node_guarantee(runtime.engine)
    assert f"this node\n  container engine: {runtime.engine.kind} ({runtime.engine.binary})" in shown, shown
    assert f"  disk cap: {guarantee.describe()}" in shown
    expected = "watched" if runtime.engine.kind == "docker" and guarantee.value == "watched" else "hard"
    assert f"disk cap: {expected}" in shown


async def test_a_hung_engine_call_is_killed_with_its_children_and_raises_an_infra_error(tmp_path: Path) -> None:
    """A `docker`/`podman` client that never answers (a wedged daemon) is killed at its time limit, with
    whatever it started, and the caller gets an EngineError (infra: the rollout is retried, never stuck)."""
    from gymflow.envs.errors import EngineError, InfraError
    from gymflow.envs.runtime.engine import Engine

    pids = tmp_path / "pids"
    hung = tmp_path / "docker"
    hung.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pids}\necho $$ >> {pids}\nwait\n")
    hung.chmod(0o755)
    engine = Engine(str(hung), kind="docker")
    started = time.monotonic()
    with pytest.raises(EngineError, match="timed out after 1s") as raised:
        await engine.run(["ps", "-a"], timeout_s=1)
    assert isinstance(raised.value, InfraError)
    assert time.monotonic() - started < 10
    for pid in map(int, pids.read_text().split()):  # the client and its child: gone (or a zombie being reaped)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"
