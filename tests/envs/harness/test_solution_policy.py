"""The scripted upstream of the mini-swe-agent tests plays tasks whose solution/ holds several files:
its one bash command, run by a real bash, writes each of them byte for byte (binary, no final newline,
quotes and heredoc markers), keeps executables executable, and runs solve.sh, which uses them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gymflow.envs.builtin.harbor.harness import SolutionPolicy, solution_command
from gymflow.envs.builtin.harbor.task import load_task
from gymflow.envs.contract import Message

TASK = Path(__file__).parent / "harbor_tasks" / "ship-tool"


def test_the_solution_command_writes_every_file_exactly_and_runs_solve_sh(tmp_path: Path) -> None:
    task = load_task(TASK)
    assert task.solution_dir is not None
    root, app = tmp_path / "solution", tmp_path / "app"
    command = solution_command(task, root=str(root))
    done = subprocess.run(
        ["bash", "-c", command], check=False, env={**os.environ, "APP": str(app)}, capture_output=True, timeout=30
    )
    assert done.returncode == 0, done.stderr.decode()
    sources = sorted(p.relative_to(task.solution_dir) for p in task.solution_dir.rglob("*") if p.is_file())
    assert sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) == sources
    for relative in sources:
        source, written = task.solution_dir / relative, root / relative
        assert written.read_bytes() == source.read_bytes(), relative
        assert os.access(written, os.X_OK) == os.access(source, os.X_OK), relative
    # solve.sh ran the helper directly and copied what it was given.
    assert (
        subprocess.run([app / "bin" / "greet"], check=False, capture_output=True, text=True).stdout
        == "hello from greet\n"
    )
    assert (app / "data" / "table.bin").read_bytes() == bytes(range(256))
    assert (app / "data" / "note.txt").read_bytes() == b"no newline at the end"


def test_the_policy_finds_the_task_the_agent_quotes_and_then_finishes() -> None:
    task = load_task(TASK)
    policy = SolutionPolicy([task])
    asked = [
        Message(role="system", content="You are a shell agent."),
        Message(role="user", content=f"Task:\n{task.instruction}"),
    ]
    first = policy.respond(asked, [])
    assert [c.arguments["command"] for c in first.tool_calls] == [solution_command(task)]
    second = policy.respond([*asked, first, Message(role="user", content="(output)")], [])
    assert [c.arguments["command"] for c in second.tool_calls] == ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    unknown = policy.respond([Message(role="user", content="Some other task.")], [])
    assert not unknown.tool_calls and "no solution" in unknown.content
