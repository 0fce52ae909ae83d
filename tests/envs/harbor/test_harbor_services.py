"""A multi-container Harbor task (environment/docker-compose.yaml) on the engine under test: the oracle
scores 1.0 and doing nothing 0.0 with a verifier that needs the task's `db` service; one rollout's
service is unreachable from another rollout; nothing of either is left after release."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from container_support import leftovers
from mcp import Client

from gymflow.envs.builtin.harbor.task import load_task
from gymflow.envs.builtin.harbor.verifier import install_solution, run_verifier, start_task
from gymflow.envs.runtime import network as net
from gymflow.envs.runtime.container import ContainerRuntime, ContainerSandbox
from gymflow.envs.runtime.engine import LABEL_MARKER, LABEL_NODE
from gymflow.envs.runtime.terminal import build_server

TASK = load_task(Path(__file__).parent / "tasks" / "service-token")


def reach(address: str) -> list[str]:
    """A command that prints what a TCP server at `address` port 7000 sends, within 5 s."""
    return ["timeout", "5", "bash", "-c", f"exec 3<>/dev/tcp/{address}/7000 && head -n1 <&3"]


async def test_the_oracle_needs_the_tasks_service_and_scores_one_null_zero(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    del base_image
    assert TASK.services is not None and TASK.services.main == "main"
    assert [s.name for s in TASK.services.sidecars()] == ["db"]

    async def attempt(oracle: bool) -> float:
        sandbox = await start_task(
            runtime, TASK, rollout_id=uuid.uuid4().hex[:8], workspace=tmp_path / uuid.uuid4().hex
        )
        try:
            if oracle:
                command = await install_solution(sandbox, TASK)
                async with Client(build_server(sandbox, memory_mb=256)) as client:
                    solved = await client.call_tool("bash", {"command": command, "timeout": 60})
                    assert not solved.is_error, solved.content
            return (await run_verifier(sandbox, TASK)).reward
        finally:
            await sandbox.release()

    assert await asyncio.gather(attempt(True), attempt(False)) == [1.0, 0.0]
    assert await leftovers(runtime.engine, runtime.node_id) == []
    assert await net.networks(runtime.engine, {LABEL_MARKER: "1", LABEL_NODE: runtime.node_id}) == []


async def test_a_rollouts_service_is_unreachable_from_another_rollout(
    runtime: ContainerRuntime, base_image: str, tmp_path: Path
) -> None:
    del base_image
    reached: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.append(1)
        writer.close()

    server = await asyncio.start_server(on_connect, "0.0.0.0", 0)  # on the host, every address
    port = server.sockets[0].getsockname()[1]
    first, second = await asyncio.gather(
        *(start_task(runtime, TASK, rollout_id=f"r{i}", workspace=tmp_path / f"ws{i}") for i in range(2))
    )
    try:
        assert isinstance(first, ContainerSandbox) and isinstance(second, ContainerSandbox)
        assert first.services is not None and second.services is not None
        assert first.services.network is not None and second.services.network is not None
        assert first.services.network.subnet != second.services.network.subnet
        own = await first.exec(reach("db"), timeout_s=30)
        assert own.ok and len(own.stdout.strip()) == 24, own  # its own db, by name
        other_db = str(first.services.addresses["db"])
        crossed = await second.exec(reach(other_db), timeout_s=30)
        assert not crossed.ok and crossed.stdout == "", crossed  # the other rollout's db: no route
        gateway = str(second.services.network.gateway)
        host = await second.exec(["timeout", "5", "bash", "-c", f"exec 3<>/dev/tcp/{gateway}/{port}"], timeout_s=30)
        assert not host.ok and reached == []  # nor the host, through its address on the rollout's network
    finally:
        server.close()
        await asyncio.gather(first.release(), second.release())
    assert await leftovers(runtime.engine, runtime.node_id) == []
    assert await net.networks(runtime.engine, {LABEL_MARKER: "1", LABEL_NODE: runtime.node_id}) == []
