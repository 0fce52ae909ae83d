"""Any MCP server runs inside a rollout's container by config (`runtime:` in an env file), beside a
host-side one acting on it by name (the terminal server over stdio); the container goes with the rollout."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from container_support import STATE_ROOT, leftovers

from gymflow.envs.envfile import env_from_file
from gymflow.envs.errors import InfraError
from gymflow.envs.runtime.engine import Engine
from gymflow.envs.runtime.node import NodeRuntimes

ENV_FILE = Path(__file__).parent / "shserver" / "env.yaml"


async def test_servers_run_in_the_rollouts_container_and_leave_with_it(base_image: str, tmp_path: Path) -> None:
    del base_image
    node = f"test-{uuid.uuid4().hex[:8]}"
    runtimes = NodeRuntimes(node_id=node, state_root=STATE_ROOT)
    env = env_from_file(ENV_FILE, workspace_root=tmp_path / "ws", pool_size=0, runtimes=runtimes)
    engine = Engine.detect()
    try:
        await env.init_rollout("r1")
        assert {t.name for t in await env.list_tools()} == {"whereami", "bash", "read_file", "write_file", "list_dir"}
        inside = await env.run_tool("r1", "whereami")
        assert not inside.is_error, inside.text
        assert "host=sandbox marker=inside-the-image greeting=hello" in inside.text
        assert "files=note.txt," in inside.text  # the seed went into the container's workspace
        shell = await env.run_tool("r1", "bash", command="hostname; cat /etc/gymflow-marker; cat note.txt")
        assert "sandbox\ninside-the-image\nseeded" in shell.text, shell.text
        written = await env.run_tool("r1", "write_file", path="out.txt", content="from the model")
        assert not written.is_error
        assert (env.workspace("r1") / "out.txt").read_text() == "from the model"  # host view of the workspace

        # The container dies under the rollout (killed outside gymflow): its servers are seen dead.
        [name] = await leftovers(engine, node)
        await engine.run(["kill", name])
        with pytest.raises(InfraError):
            await env.run_tool("r1", "whereami")
        await env.release_rollout("r1")
        assert await leftovers(engine, node) == []
        assert not (tmp_path / "ws").exists() or not any((tmp_path / "ws").glob("ws-*"))
    finally:
        await env.shutdown()
        await runtimes.close()
        assert await leftovers(engine, node) == []
