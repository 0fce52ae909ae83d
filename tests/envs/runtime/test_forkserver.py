"""Forked MCP servers (gymflow.envs.runtime.forkserver): real fork servers, real server processes.

A forked server must be indistinguishable from a plain one to everything that holds it: its own
process and session, its own workspace, environment and state, its exit code and stderr in the
error that reports its death, killed by a tool timeout. What cannot be forked safely starts plainly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp_support import wait_until

from gymflow.envs.errors import InfraError
from gymflow.envs.mcp.config import McpServerConfig
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.mcp.session import McpSession
from gymflow.envs.runtime import forkserver
from gymflow.envs.runtime.forkserver import ForkServers, fork_target, node_fork_servers
from support import COUNTER_SERVER

SERVER = textwrap.dedent(
    """
    import os, sys, time
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("probe")
    state = {"secret": None}

    @server.tool()
    def remember(secret: str) -> str:
        state["secret"] = secret
        return "ok"

    @server.tool()
    def recall() -> str:
        return str(state["secret"])

    @server.tool()
    def where() -> dict:
        return {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                "env": dict(os.environ), "sid": os.getsid(0), "nice": os.nice(0)}

    @server.tool()
    def hang() -> str:
        time.sleep(600)
        return "late"

    @server.tool()
    def crash() -> str:
        print("the probe server gives up", file=sys.stderr, flush=True)
        os._exit(3)

    if __name__ == "__main__":
        server.run()
    """
)


@pytest.fixture
def forks() -> Iterator[ForkServers]:
    """The node's fork servers, none started, on for the test; stopped after it."""
    servers = node_fork_servers()
    servers.close()
    switch, servers.switch = servers.switch, True
    yield servers
    servers.close()
    servers.switch = switch


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    path = tmp_path / "probe_server.py"
    path.write_text(SERVER)
    return path


async def started(name: str, config: McpServerConfig, workspace: Path, **kwargs: object) -> McpSession:
    workspace.mkdir(parents=True, exist_ok=True)
    session = McpSession(name, config, workspace=workspace, **kwargs)  # type: ignore[arg-type]
    await session.start()
    return session


async def test_forked_servers_are_separate_processes_with_their_own_state(
    forks: ForkServers, probe: Path, tmp_path: Path
) -> None:
    config = McpServerConfig(command="python", args=[str(probe), "--flag", "x"], env={"WHERE": "{workspace}"})
    a = await started("probe", config, tmp_path / "a", nice=2)
    b = await started("probe", config, tmp_path / "b")
    try:
        assert len(forks.servers) == 1, "both came from one fork server"
        zygote = next(iter(forks.servers.values())).process
        assert zygote is not None
        assert (await a.call("remember", {"secret": "alpha"})).text == "ok"
        assert (await b.call("recall", {})).text == "None", "b sees nothing of a's memory"
        assert (await a.call("recall", {})).text == "alpha"
        facts_a = json.loads((await a.call("where", {})).text)
        facts_b = json.loads((await b.call("where", {})).text)
        assert facts_a is not None and facts_b is not None
        for facts, session, workspace in ((facts_a, a, tmp_path / "a"), (facts_b, b, tmp_path / "b")):
            assert facts["pid"] == session.pid and facts["ppid"] == zygote.pid != os.getpid()
            assert facts["sid"] == session.pid, "its own session: a timeout kills its whole group"
            assert facts["cwd"] == str(workspace)
            assert facts["argv"] == ["--flag", "x"]
            assert facts["env"]["WHERE"] == str(workspace)
            assert "PYTEST_CURRENT_TEST" not in facts["env"], "only the server's environment, as a plain start"
        assert facts_a["nice"] == facts_b["nice"] + 2
    finally:
        await a.close()
        await b.close()
    assert a.returncode == 0 and b.returncode == 0, "stdin closed: the servers exited on their own"


async def test_a_hung_tool_kills_the_forked_server_and_its_death_is_reported(
    forks: ForkServers, probe: Path, tmp_path: Path
) -> None:
    config = McpServerConfig(command="python", args=[str(probe)], tool_timeouts={"hang": 1.0})
    session = await started("probe", config, tmp_path / "ws")
    try:
        assert forks.servers, "it was forked"
        result = await session.call("hang", {})
        assert result.is_error and "timed out after 1s and its server was stopped" in result.text
        assert session.returncode == -signal.SIGKILL
        with pytest.raises(InfraError, match="exited with code -9"):
            await session.call("recall", {})
    finally:
        await session.close()


async def test_a_crashed_forked_server_says_its_exit_code_and_stderr(
    forks: ForkServers, probe: Path, tmp_path: Path
) -> None:
    session = await started("probe", McpServerConfig(command="python", args=[str(probe)]), tmp_path / "ws")
    try:
        with pytest.raises(InfraError) as caught:
            await session.call("crash", {})
        assert "exited with code 3" in str(caught.value)
        assert "the probe server gives up" in str(caught.value)
    finally:
        await session.close()


async def test_a_module_server_is_forked_with_its_imports_loaded_once(forks: ForkServers, tmp_path: Path) -> None:
    config = McpServerConfig(command="python", args=["-m", "gymflow.envs.builtin.math.servers.calculator"])
    sessions = [await started("calculator", config, tmp_path / f"ws{i}") for i in range(3)]
    try:
        assert len(forks.servers) == 1
        for session in sessions:
            assert (await session.call("add", {"a": 2, "b": 3})).text == "5"
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


async def test_imports_that_start_a_thread_get_the_plain_start(forks: ForkServers, tmp_path: Path) -> None:
    script = tmp_path / "threaded_server.py"
    (tmp_path / "busy_helper.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    script.write_text("import busy_helper\n" + SERVER)
    session = await started("probe", McpServerConfig(command="python", args=[str(script)]), tmp_path / "ws")
    try:
        facts = json.loads((await session.call("where", {})).text)
        assert facts is not None and facts["ppid"] == os.getpid(), "started by the worker itself"
        (reason,) = forks.refused.values()
        assert "started threads" in reason
    finally:
        await session.close()


async def test_fork_can_be_turned_off_per_server(forks: ForkServers, probe: Path, tmp_path: Path) -> None:
    off = await started("probe", McpServerConfig(command="python", args=[str(probe)], fork=False), tmp_path / "a")
    try:
        facts = json.loads((await off.call("where", {})).text)
        assert facts is not None and facts["ppid"] == os.getpid() and not forks.servers
    finally:
        await off.close()


def test_the_node_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ForkServers(switch=False).enabled is False
    monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
    assert ForkServers().enabled is False
    monkeypatch.setenv(forkserver.ENV_SWITCH, "1")
    assert ForkServers().enabled is True


def test_what_is_forked(tmp_path: Path) -> None:
    python = sys.executable
    assert fork_target(python, ["-m", "pkg.server", "--x"], {}, tmp_path) is not None
    assert fork_target(python, [str(COUNTER_SERVER)], {}, tmp_path) is not None
    assert fork_target(python, ["server.py"], {}, tmp_path) is None, "relative: resolved per workspace"
    assert fork_target(python, ["-c", "print(1)"], {}, tmp_path) is None
    assert fork_target("/usr/bin/node", ["server.js"], {}, tmp_path) is None
    per_rollout = {"PYTHONPATH": f"{tmp_path}/lib"}
    assert fork_target(python, ["-m", "pkg.server"], per_rollout, tmp_path) is None
    shared = {"PYTHONPATH": "/opt/lib"}
    target = fork_target(python, ["-m", "pkg.server"], shared, tmp_path)
    assert target is not None and target.python_env == (("PYTHONPATH", "/opt/lib"),)


async def test_a_dead_fork_server_is_replaced_and_its_children_live_on(
    forks: ForkServers, probe: Path, tmp_path: Path
) -> None:
    config = McpServerConfig(command="python", args=[str(probe)])
    first = await started("probe", config, tmp_path / "a")
    try:
        zygote = next(iter(forks.servers.values())).process
        assert zygote is not None
        zygote.kill()
        zygote.wait()
        assert (await first.call("remember", {"secret": "still here"})).text == "ok"
        second = await started("probe", config, tmp_path / "b")
        try:
            assert next(iter(forks.servers.values())).process is not zygote
            assert (await second.call("recall", {})).text == "None"
        finally:
            await second.close()
    finally:
        await first.close()
    await wait_until(lambda: first.returncode is not None, what="the orphaned child's exit seen")
    assert first.returncode == forkserver.STATUS_UNKNOWN, "its fork server was gone: the code is unknown"


def test_a_fork_server_dies_with_its_worker(tmp_path: Path, probe: Path) -> None:
    """kill -9 of the worker: its fork server goes too, and its forked server ends with its stdin."""
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from gymflow.envs.mcp.config import McpServerConfig
        from gymflow.envs.mcp.session import McpSession
        from gymflow.envs.runtime.forkserver import node_fork_servers

        async def main():
            ws = Path({str(tmp_path / "ws")!r}); ws.mkdir()
            session = McpSession("probe", McpServerConfig(command="python", args=[{str(probe)!r}]), workspace=ws)
            await session.start()
            zygote = next(iter(node_fork_servers().servers.values())).process.pid
            print(zygote, session.pid, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
        """
    )
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        zygote, server = (int(x) for x in worker.stdout.readline().split())
    finally:
        worker.kill()
        worker.wait()
    asyncio.run(_gone_both(zygote, server))


async def _gone_both(*pids: int) -> None:
    def exists(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"

    await wait_until(lambda: not any(exists(pid) for pid in pids), what="the fork server and its child gone")


async def test_a_server_that_serves_at_top_level_is_forked_without_being_warmed(
    forks: ForkServers, tmp_path: Path
) -> None:
    """The fork server runs a target's top level once only when the source guards its serving with
    `if __name__ == "__main__":`; one that serves unguarded would serve inside the fork server."""
    script = tmp_path / "unguarded_server.py"
    script.write_text(SERVER.replace('if __name__ == "__main__":\n    server.run()', "server.run()"))
    assert "if __name__" not in script.read_text()
    session = await started("probe", McpServerConfig(command="python", args=[str(script)]), tmp_path / "ws")
    try:
        facts = json.loads((await session.call("where", {})).text)
        zygote = next(iter(forks.servers.values())).process
        assert zygote is not None and facts["ppid"] == zygote.pid
    finally:
        await session.close()


async def test_a_fork_server_that_stops_answering_costs_a_plain_start_not_a_hung_worker(
    forks: ForkServers, probe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = McpServerConfig(command="python", args=[str(probe)])
    first = await started("probe", config, tmp_path / "a")
    await first.close()
    zygote = next(iter(forks.servers.values())).process
    assert zygote is not None
    monkeypatch.setattr(forkserver, "SPAWN_TIMEOUT_S", 1.0)
    os.kill(zygote.pid, signal.SIGSTOP)
    try:
        session = await started("probe", config, tmp_path / "b")
        try:
            facts = json.loads((await session.call("where", {})).text)
            assert facts["ppid"] == os.getpid(), "started plainly while its fork server hung"
            assert not forks.servers, "the hung fork server was let go"
        finally:
            await session.close()
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed already, as it should be
            os.kill(zygote.pid, signal.SIGCONT)
    await wait_until(lambda: zygote.poll() is not None, what="the hung fork server killed")


async def test_an_env_that_shuts_down_stops_the_fork_servers_it_used(forks: ForkServers, tmp_path: Path) -> None:
    """No process of an env's programs outlives the env: its shutdown stops their fork servers (a
    package venv's fork server would otherwise hold the venv until the worker exits)."""
    env = McpEnv(
        servers={"calculator": {"command": "python", "args": ["-m", "gymflow.envs.builtin.math.servers.calculator"]}},
        workspace_root=tmp_path / "workspaces",
        pool_size=0,
    )
    await env.init_rollout("r")
    zygote = next(iter(forks.servers.values())).process
    assert zygote is not None
    await env.shutdown()
    assert not forks.servers and zygote.poll() is not None
