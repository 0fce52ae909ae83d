"""Agent programs from PyPI that the harness tests run unmodified, each in a venv of its own.

An agent you already have brings its own dependencies, so each gets a venv under `.agents/<name>`
(never the project's): the official `openai` and `anthropic` clients for the small test agents in
tests/agents/, and mini-swe-agent. `.ci/run` installs them with

    python3 tests/third_party_agents.py          # installs the missing ones; stdlib only

and the tests that need one skip, saying how to install it, when its venv is absent.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".agents"


@dataclass(frozen=True)
class ThirdPartyAgent:
    """A venv of PyPI packages an agent program runs with."""

    executable: str
    """The venv's program to run (`python` for the tests' own agents)."""
    requirements: tuple[str, ...]


AGENTS = {
    # the official clients, for tests/agents/openai_agent.py and anthropic_agent.py
    "clients": ThirdPartyAgent("python", ("openai==3.57.0", "anthropic==2.14.0")),
    # mini-swe-agent's `mini`, litellm inside (tests/envs/harness/test_mini_swe_agent.py)
    "mini-swe-agent": ThirdPartyAgent("mini", ("mini-swe-agent==2.4.6",)),
}


def executable(name: str) -> Path:
    """Where agent `name`'s executable is once installed."""
    return VENVS / name / "bin" / AGENTS[name].executable


def install_command(name: str) -> str:
    """The shell command that installs agent `name` (for skip messages)."""
    return f"python3 -m venv {VENVS / name} && {VENVS / name}/bin/pip install {' '.join(AGENTS[name].requirements)}"


def install(name: str) -> None:
    """Create agent `name`'s venv and install its pinned packages (if not installed yet)."""
    if executable(name).exists():
        return
    venv = VENVS / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *AGENTS[name].requirements], check=True)


if __name__ == "__main__":
    for agent in sys.argv[1:] or AGENTS:
        install(agent)
        print(f"{agent}: {executable(agent)}")
