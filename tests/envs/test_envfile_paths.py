"""Paths in an env file are relative to the env file, wherever gymflow runs from (issue 31's
`args: [letters_server.py]`); the workspace is `{workspace}`, and the server's working directory."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from gymflow.envs.envfile import env_from_file
from gymflow.envs.errors import EnvFileError
from gymflow.envs.registry import env_class

SERVER = '''
import json, os, sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("letters")

@server.tool()
def where() -> str:
    """The server's arguments and working directory."""
    return json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd()})

@server.tool()
def count(letter: str) -> int:
    """How often `letter` occurs in the word list the server was given."""
    words = next(a for a in sys.argv if a.startswith("--words=")).removeprefix("--words=")
    return open(words).read().count(letter)

server.run()
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An env directory with a server file and a data file; the test runs from another directory."""
    root = tmp_path / "mytoy"
    (root / "data").mkdir(parents=True)
    (root / "letters_server.py").write_text(SERVER)
    (root / "data" / "words.txt").write_text("strawberry raspberry\n")
    (root / "run.sh").write_text('#!/bin/sh\nexec python3 letters_server.py "$@"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return root


def write(root: Path, servers: str, extra: str = "") -> Path:
    path = root / "letters.yaml"
    path.write_text(textwrap.dedent(servers).strip() + "\n" + extra)
    return path


async def test_a_server_file_next_to_the_env_file_runs_from_anywhere(toy: Path, tmp_path: Path) -> None:
    path = write(toy, """
        mcpServers:
          letters:
            command: python
            args: [letters_server.py, --words=data/words.txt, shop.db, ., "{workspace}/x.db"]
        """)  # fmt: skip
    env = env_from_file(os.path.relpath(path), workspace_root=tmp_path / "ws", pool_size=0)
    try:
        await env.init_rollout("r")
        seen = json.loads((await env.run_tool("r", "where")).text)
        workspace = env.workspace("r")
        assert seen["argv"] == [
            f"--words={toy / 'data' / 'words.txt'}",  # names a file there: made absolute
            "shop.db",  # names nothing there: a file in the workspace, each rollout its own
            ".",  # the working directory: the workspace
            f"{workspace}/x.db",
        ]
        assert Path(seen["cwd"]).resolve() == workspace.resolve()
        assert (await env.run_tool("r", "count", letter="r")).text == "6"
    finally:
        await env.shutdown()


def server_config(path: Path, name: str = "letters") -> dict[str, object]:
    return dict(env_class(str(path)).mcp_servers[name])


def test_command_and_cwd_are_relative_to_the_env_file(toy: Path) -> None:
    path = write(toy, """
        mcpServers:
          script: {command: ./run.sh, cwd: data}
          bare: {command: mcp-server-calculator, args: [-m, gymflow.envs.builtin.math.servers.calculator, UTC]}
          inside: {command: python, cwd: "{workspace}/sub", args: [-m, x]}
        """)  # fmt: skip
    assert server_config(path, "script")["command"] == str(toy / "run.sh")
    assert server_config(path, "script")["cwd"] == str(toy / "data")
    assert server_config(path, "bare") == {
        "command": "mcp-server-calculator",
        "args": ["-m", "gymflow.envs.builtin.math.servers.calculator", "UTC"],
    }
    assert server_config(path, "inside")["cwd"] == "{workspace}/sub"  # filled in per rollout


def test_a_missing_server_file_is_an_error_at_load_not_a_dead_rollout(toy: Path) -> None:
    path = write(toy, "mcpServers:\n  letters: {command: python, args: [lettrs_server.py]}\n")
    with pytest.raises(EnvFileError) as caught:
        env_class(str(path))
    assert str(caught.value) == (
        f"{path}: mcpServers.letters.args[0]: no file {toy / 'lettrs_server.py'}; a relative path is relative "
        "to the env file (write `{workspace}/lettrs_server.py` for a file the workspace setup makes)"
    )


def test_a_server_file_seeded_into_the_workspace_is_not_missing(toy: Path) -> None:
    (toy / "src").mkdir()
    (toy / "letters_server.py").rename(toy / "src" / "server.py")
    path = write(toy, "mcpServers:\n  letters: {command: python, args: [server.py]}\n",
                 "workspace: {files: {server.py: src/server.py}}\n")  # fmt: skip
    assert server_config(path)["args"] == ["server.py"]  # run from the workspace, where the seed puts it
