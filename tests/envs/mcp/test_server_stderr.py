"""A server that dies says why: the end of its stderr reaches the rollout's error, the logs and `gymflow inspect`.

The end-to-end test is the user's path from issue 31: an env file next to its own server file, run
with `gymflow rollout` from another directory, the server failing at start; then `gymflow inspect`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from mcp_support import MakeEnv

from gymflow.envs.errors import InfraError
from gymflow.envs.runtime.transport import STDERR_TAIL_BYTES, log_tail

ROOT = Path(__file__).parents[3]

POLICY = """
from gymflow.envs.contract import Message
from gymflow.envs.policy import Policy

class Guess(Policy):
    name = "guess"

    def respond(self, messages, tools):
        return Message(role="assistant", content="<answer>3</answer>")
"""


def dying_server(path: Path, marker: str, *, noise_lines: int = 0, code: int = 3) -> Path:
    """A Python file that writes `noise_lines` lines, then `marker`, to stderr and exits with `code`."""
    path.write_text(
        textwrap.dedent(f"""
        import sys
        for i in range({noise_lines}):
            print(f"noise line {{i}} " + "x" * 60, file=sys.stderr)
        print({marker!r}, file=sys.stderr)
        sys.exit({code})
        """)
    )
    return path


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", *args], capture_output=True, text=True, timeout=180, cwd=cwd,
        env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip


@pytest.mark.heavy
def test_a_server_that_fails_at_start_says_why_in_the_error_the_logs_and_inspect(
    temporal_address: str, tmp_path: Path
) -> None:
    marker = f"letters: cannot open words.db ({uuid.uuid4().hex[:8]})"
    toy = tmp_path / "mytoy"
    toy.mkdir()
    dying_server(toy / "letters_server.py", marker, noise_lines=200)  # ~14 KB: only the end is kept
    (toy / "policy.py").write_text(POLICY)
    (toy / "tasks.jsonl").write_text('{"id": "l1", "prompt": "How many r in strawberry?", "answer": "3"}\n')
    (toy / "letters.yaml").write_text(
        "mcpServers:\n  letters: {command: python, args: [letters_server.py]}\n"
        "dataset: tasks.jsonl\npolicies: {reference: policy.py:Guess}\n"
    )
    run = cli(
        "rollout", "mytoy/letters.yaml", "--json", "--log-format", "json", "--address", temporal_address,
        "--task-queue", f"stderr-{uuid.uuid4().hex[:8]}", cwd=tmp_path,  # not the env file's directory
        env={"GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "ws"), "GYMFLOW_DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-3000:]  # infra-failed, never scored
    (rollout,) = json.loads(run.stdout)["rollouts"]
    assert rollout["infra_failed"] and rollout["reward"] is None and rollout["termination"] == "env_error"
    error = rollout["error"]
    assert "MCP server 'letters'" in error and "exited with code 3; its stderr ends:" in error, error
    assert error.rstrip().endswith(marker)
    assert "noise line 0 " not in error and len(error) < STDERR_TAIL_BYTES + 300  # bounded: the tail only

    # The logs: the activity's failed attempts (JSON lines on stderr) carry it too.
    records = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    failed = [r for r in records if r.get("event") == "activity attempt failed" and r.get("activity") == "init_rollout"]
    assert failed and all(marker in r["error"] for r in failed), run.stderr[-3000:]

    # And `gymflow inspect`, read from the rollout's history: in the outcome and in the init step, once each.
    view = cli("inspect", rollout["workflow_id"], "--address", temporal_address, cwd=tmp_path)
    assert view.returncode == 0, view.stderr[-3000:]
    assert "infra-failed (no reward) · env_error" in view.stdout
    assert view.stdout.count(marker) == 2, view.stdout
    assert "error: init_rollout: could not start MCP server 'letters': MCP server 'letters'" in view.stdout


async def test_a_server_that_dies_during_a_call_says_why(make_env: MakeEnv, tmp_path: Path) -> None:
    marker = f"letters: out of memory ({uuid.uuid4().hex[:8]})"
    script = tmp_path / "dies.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("dies")

        @server.tool()
        def die() -> str:
            \"\"\"Exit the server mid-call.\"\"\"
            print({marker!r}, file=sys.stderr, flush=True)
            os._exit(7)

        server.run()
        """)
    )
    env = make_env({"dies": {"command": "python", "args": [str(script)]}})
    await env.init_rollout("r")
    with pytest.raises(InfraError) as caught:
        await env.run_tool("r", "die")
    message = str(caught.value)
    assert "MCP server 'dies'" in message and "exited with code 7" in message, message
    assert message.rstrip().endswith(marker)


async def test_an_http_server_that_exits_before_listening_says_why(make_env: MakeEnv, tmp_path: Path) -> None:
    marker = f"shop: no such database ({uuid.uuid4().hex[:8]})"
    script = dying_server(tmp_path / "http_dies.py", marker, code=4)
    env = make_env(
        {"shop": {"command": "python", "args": [str(script), "{port}"], "url": "http://127.0.0.1:{port}/mcp"}}
    )
    with pytest.raises(InfraError, match="exited with code 4 before listening") as caught:
        await env.init_rollout("r")
    assert str(caught.value).rstrip().endswith(marker)


@pytest.mark.slow  # waits out the handshake timeout; a server failing at start stays default
async def test_a_server_that_never_answers_the_handshake_says_what_it_wrote(make_env: MakeEnv, tmp_path: Path) -> None:
    marker = f"waiting for a license server ({uuid.uuid4().hex[:8]})"
    script = tmp_path / "hangs.py"
    script.write_text(f"import sys, time\nprint({marker!r}, file=sys.stderr, flush=True)\ntime.sleep(600)\n")
    env = make_env({"hangs": {"command": "python", "args": [str(script)], "startup_timeout_s": 2}})
    with pytest.raises(InfraError, match="no handshake within 2") as caught:
        await env.init_rollout("r")
    assert str(caught.value).rstrip().endswith(marker)


def test_log_tail_is_bounded_whole_lines_and_never_fails(tmp_path: Path) -> None:
    log = tmp_path / "server.stderr.log"
    assert log_tail(log) == "" and log_tail(None) == ""  # no file: nothing to say
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(2000)) + b"bad \xff byte\n")
    tail = log_tail(log, limit=200)
    assert tail.startswith("…line ") and tail.endswith("bad \ufffd byte") and len(tail.encode()) <= 200
    assert all(line.startswith(("…line", "line", "bad")) for line in tail.splitlines())  # the cut line is dropped
    log.write_text("  short\n\n")
    assert log_tail(log) == "short"
