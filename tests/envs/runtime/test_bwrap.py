"""The bwrap runtime: commands and MCP servers in bubblewrap on the worker's own root, behind the same
interface as containers (only the workspace writable, no network, a uid of its own as root)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from gymflow.envs.envfile import env_from_file
from gymflow.envs.runtime.base import Limits, RolloutSpec
from gymflow.envs.runtime.bwrap import BwrapRuntime, unavailable_bwrap
from gymflow.envs.runtime.node import NodeRuntimes

SERVER = Path(__file__).parent / "shserver" / "server.sh"


@pytest.fixture(autouse=True)
def bwrap_or_skip() -> None:
    problem = unavailable_bwrap()
    if problem is not None:
        if os.environ.get("GYMFLOW_SANDBOX_REQUIRE") == "bwrap":
            pytest.fail(f"bwrap is required here: {problem}")
        pytest.skip(str(problem))


async def test_commands_see_only_their_workspace(tmp_path: Path) -> None:
    spec = RolloutSpec(rollout_id=uuid.uuid4().hex[:8], node_id="n", workspace=str(tmp_path / "ws"),
                       limits=Limits(memory_mb=256, pids=64))  # fmt: skip
    sandbox = await BwrapRuntime().start(spec)
    try:
        (tmp_path / "secret.txt").write_text("host file")
        done = await sandbox.exec(
            ["sh", "-c", "echo hi > note.txt; pwd; hostname; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"],
            timeout_s=30,
        )
        assert done.ok, done.stderr
        assert done.stdout.split() == ["/workspace", "sandbox", "lo"]  # no network but its own loopback
        assert (tmp_path / "ws" / "note.txt").read_text() == "hi\n"
        outside = await sandbox.exec(["sh", "-c", f"cat {tmp_path}/secret.txt; touch /usr/x"], timeout_s=30)
        assert outside.exit_code != 0 and "host file" not in outside.stdout
        if os.geteuid() == 0:
            uid = await sandbox.exec(["id", "-u"], timeout_s=30)
            assert int(uid.stdout) >= 1_200_000
        slow = await sandbox.exec(["sleep", "30"], timeout_s=0.5)
        assert slow.timed_out and slow.exit_code is None
    finally:
        await sandbox.release()
        shutil.rmtree(tmp_path / "ws", ignore_errors=True)


async def test_an_mcp_server_runs_in_the_rollouts_bwrap_sandbox(tmp_path: Path) -> None:
    config = {
        "mcpServers": {"inside": {"command": "sh", "args": ["{workspace}/server.sh"], "env": {"GREETING": "hi"}}},
        "runtime": {"kind": "bwrap"},
        "workspace": {"files": {"server.sh": str(SERVER)}},
    }
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump(config))
    runtimes = NodeRuntimes(node_id="bwrap-test", state_root=tmp_path / "state")
    env = env_from_file(path, workspace_root=tmp_path / "wsroot", pool_size=0, runtimes=runtimes)
    try:
        await env.init_rollout("r1")
        result = await env.run_tool("r1", "whereami")
        assert "host=sandbox" in result.text and "greeting=hi" in result.text and "cwd=/workspace" in result.text
        assert "files=server.sh," in result.text
    finally:
        await env.shutdown()
        await runtimes.close()
