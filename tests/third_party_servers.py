"""Third-party MCP servers from PyPI that the tests drive by env files alone, each in its own venv.

They pin their own mcp versions (1.x or 2.x), so each gets a venv of its own under
`.mcp-servers/<name>`, as `uvx` would. `.ci/run` installs them with

    python3 tests/third_party_servers.py          # installs the missing ones; stdlib only

and the tests that need one skip, saying how to install it, when its venv is absent.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".mcp-servers"


@dataclass(frozen=True)
class ThirdPartyServer:
    """A PyPI package providing an MCP server executable."""

    executable: str
    requirements: tuple[str, ...]
    """Exact pins: the server and the mcp version it was tested with."""


SERVERS = {
    # arithmetic; stateless (tests/envs/mcp/test_third_party.py)
    "calculator": ThirdPartyServer("mcp-server-calculator", ("mcp-server-calculator==0.2.1", "mcp==1.30.0")),
    # a git repository in the workspace: seeded files + a `git init` setup, absolute repo_path
    "git": ThirdPartyServer("mcp-server-git", ("mcp-server-git==2026.10.19", "mcp==2.3.0")),
    # a SQLite database file in the workspace: seeded file, `{workspace}` in args, writes per rollout
    "sqlite": ThirdPartyServer("mcp-server-sqlite", ("mcp-server-sqlite==2025.4.25", "mcp==1.30.0")),
    # time-zone conversion with bundled tzdata; offline
    "time": ThirdPartyServer("mcp-server-time", ("mcp-server-time==2026.10.19", "mcp==2.3.0")),
}


def executable(name: str) -> Path:
    """Where server `name`'s executable is once installed."""
    return VENVS / name / "bin" / SERVERS[name].executable


def install_command(name: str) -> str:
    """The shell command that installs server `name` (for skip messages)."""
    return f"python3 -m venv {VENVS / name} && {VENVS / name}/bin/pip install {' '.join(SERVERS[name].requirements)}"


def install(name: str) -> None:
    """Create server `name`'s venv and install its pinned packages (if not installed yet)."""
    if executable(name).exists():
        return
    venv = VENVS / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *SERVERS[name].requirements], check=True)


if __name__ == "__main__":
    for server in sys.argv[1:] or SERVERS:
        install(server)
        print(f"{server}: {executable(server)}")
