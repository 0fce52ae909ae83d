"""The bridge's protocol and process hygiene, run with this interpreter (no package venv needed):
gymflow's own MCP client speaks to it, env code that prints cannot corrupt the channel, a tool that
raises is the model's observation, and every process the env started dies with the rollout."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gymflow.envs.mcp.config import McpServerConfig
from gymflow.envs.mcp.session import McpSession
from gymflow.envs.packages import launch
from gymflow.envs.packages.bridge.__main__ import ENV_VAR
from gymflow.envs.packages.store import EnvDecl
from gymflow.envs.runtime.forkserver import node_fork_servers

HERE = Path(__file__).parent


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gone(pid: int, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture
async def bridge(tmp_path: Path) -> AsyncIterator[McpSession]:
    env = {
        "PYTHONPATH": os.pathsep.join([str(launch.bridge_path()), str(HERE)]),
        ENV_VAR: json.dumps({"target": "bridge_env:LeakyEnv", "kind": "", "options": {}}),
    }
    config = McpServerConfig(command=sys.executable, args=launch.bridge_args("serve"), env=env)
    session = McpSession("env", config, workspace=tmp_path)
    await session.start()
    yield session
    await session.close()


async def control(session: McpSession, verb: str, **args: object) -> dict[str, object]:
    result = await session.call(f"gymflow.{verb}", dict(args))
    return {"is_error": result.is_error, **json.loads(result.text)}


async def test_the_bridge_serves_a_plain_env_over_mcp(bridge: McpSession) -> None:
    names = [t.name for t in bridge.tool_specs()]
    assert names[:3] == ["shout", "boom", "spawn"] and all(n.startswith("gymflow.") for n in names[3:])
    assert (await control(bridge, "init", rollout_id="r", args={"bad": 1})) == {
        "is_error": True,
        "error": "BadArguments: init_rollout: init_rollout() got an unexpected keyword argument 'bad'",
        "kind": "args",
    }
    assert not (await control(bridge, "init", rollout_id="r", args={}))["is_error"]
    shouted = await bridge.call("shout", {"text": "hi"})
    assert not shouted.is_error and shouted.text == "{'said': 'hi'}"  # str(), as benchmax renders results
    boom = await bridge.call("boom", {})
    assert boom.is_error and "RuntimeError: the tool broke" in boom.text
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "yes"}]
    reward = await control(bridge, "reward", messages=messages, ground_truth="yes")
    assert reward["components"] == {"calls": 2.0, "echo": 1.0}
    assert "printed to stdout by the env" in bridge.log_path.read_text()  # on stderr, kept in the log


async def test_release_kills_what_the_env_started(bridge: McpSession) -> None:
    await control(bridge, "init", rollout_id="r", args={})
    leaked = int((await bridge.call("spawn", {})).text)
    assert alive(leaked)
    released = await control(bridge, "release")
    assert released["killed"] >= 1 and gone(leaked)


async def test_a_bridge_whose_client_goes_away_kills_what_the_env_started(bridge: McpSession) -> None:
    await control(bridge, "init", rollout_id="r", args={})
    leaked = int((await bridge.call("spawn", {})).text)
    bridge_pid = bridge.pid
    assert bridge_pid is not None and alive(leaked)
    assert bridge.transport is not None and bridge.transport.process is not None
    # The worker dies: the bridge's stdin closes (as after a kill -9 of the worker) and nothing else.
    stdin = bridge.transport.process.stdin
    assert stdin is not None
    await stdin.aclose()
    assert gone(bridge_pid) and gone(leaked)


def test_a_bridges_fork_server_imports_the_env_and_its_adapter() -> None:
    """Each rollout's bridge is forked from a per-venv fork server that has imported, besides the
    bridge, the env's own module and the bridge's adapter for its kind (gymflow.envs.runtime.forkserver)."""
    decl = EnvDecl(name="wiki", target="wiki_env.main:load_environment", kind="verifiers")
    assert launch.bridge_preload(decl) == ["gymflow_bridge.verifiers", "wiki_env.main"]
    plain = EnvDecl(name="calc", target="calc_env:CalcEnv", kind="benchmax")
    assert launch.bridge_preload(plain) == ["gymflow_bridge.plain", "calc_env"]


async def test_the_bridge_is_forked_from_its_fork_server(bridge: McpSession) -> None:
    servers = node_fork_servers().servers
    zygotes = {s.process.pid for s in servers.values() if s.process is not None}
    bridge_pid = bridge.pid
    assert bridge_pid is not None
    parent = int(Path(f"/proc/{bridge_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert parent in zygotes, "a forked bridge, not a fresh interpreter"
