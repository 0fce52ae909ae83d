"""Server configs and env files: bad input is a ValueError that names the key at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from gymflow.envs.envfile import env_class_from_file, load_env_file
from gymflow.envs.errors import EnvFileError
from gymflow.envs.mcp.config import parse_servers
from gymflow.envs.registry import env_class, storage_name


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({}, "needs 'command'"),
        ({"url": "ftp://x"}, "must be an http(s) URL"),
        ({"url": "http://127.0.0.1:{port}/mcp"}, "no 'command'"),
        ({"command": "srv", "url": "http://127.0.0.1:8000/mcp"}, "must contain '{port}'"),
        ({"command": "srv", "url": "http://0.0.0.0:{port}/mcp"}, "must be on 127.0.0.1"),
        ({"command": "srv", "parsers": {"t": "yaml"}}, "parser of tool 't'"),
        ({"command": "srv", "tool_timeout_s": 0}, "tool_timeout_s"),
        ({"command": "srv", "colour": "red"}, "colour"),
    ],
)
def test_bad_server_config_names_server_and_field(server: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=r"mcpServers\.calc") as info:
        parse_servers({"mcpServers": {"calc": server}})
    assert message in str(info.value)


def test_per_rollout_http_server_config() -> None:
    (cfg,) = parse_servers({"s": {"command": "srv", "args": ["--port", "{port}", "--db", "{workspace}/db"],
                                  "url": "http://localhost:{port}/mcp"}}).values()  # fmt: skip
    assert cfg.per_rollout_http
    assert cfg.render(workspace="/w", port=9) == (["--port", "9", "--db", "/w/db"], {})


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mcpServers: {calc: {command: srv}}\nrewrad: x.py:f\n", "rewrad: Extra inputs are not permitted"),
        ("system_prompt: hi\n", "needs 'mcpServers' (tools for the model) or 'harness'"),
        ("mcpServers: {calc: {args: [a]}}\n", "mcpServers.calc"),
        ("mcpServers: {calc: {command: srv}}\nstateless: maybe\n", "stateless"),
        ("mcpServers: {calc: {command: srv}}\nreward: []\n", "reward"),
        ("- just\n- a list\n", "must be a mapping"),
        ("mcpServers: {calc: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_env_file_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "env.yaml", text)
    with pytest.raises(ValueError, match=r"env\.yaml") as info:
        load_env_file(path)
    assert message in str(info.value)


def test_reward_that_cannot_be_loaded_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path / "env.yaml", "mcpServers: {calc: {command: srv}}\nreward: missing.py:score\n")
    with pytest.raises(EnvFileError, match=r"reward: cannot load 'missing.py'"):
        env_class_from_file(path)
    write(tmp_path / "r.py", "x = 1\n")
    path = write(tmp_path / "env2.json", '{"mcpServers": {"calc": {"command": "srv"}}, "reward": "r.py:score"}')
    with pytest.raises(EnvFileError, match=r"reward: 'r.py' has no function 'score'"):
        env_class_from_file(path)


def test_registry_resolves_env_files_by_path(tmp_path: Path) -> None:
    path = write(tmp_path / "my env.yaml", "mcpServers: {calc: {command: srv}}\nstateless: true\n")
    cls = env_class(str(path))
    assert cls.name == str(path) and cls.stateless and not cls.replayable
    assert env_class(str(path)) is cls  # built once while the file is unchanged
    with pytest.raises(EnvFileError, match="not found"):
        env_class(str(tmp_path / "absent.yml"))
    assert "/" not in storage_name(str(path)) and storage_name("math") == "math"
