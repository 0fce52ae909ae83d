"""Three more kinds of PyPI MCP servers, each in its own venv, driven by an env file alone: a git
repository (seeded files + a `git init` setup, the workspace's absolute path in the prompt), a
SQLite database (a seeded file, `{workspace}` in the server's args, writes isolated per rollout)
and time-zone conversion (the default reward reads the `<answer>` tag). Real rollouts, offline."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import textwrap
from collections.abc import Sequence
from pathlib import Path

from mcp_support import third_party
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput, RolloutResult
from gymflow.envs.contract import Message, Task, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from support import call


async def run_all(
    client: Client, worker: RunningWorker, policy: Policy, env: Path, tasks: Sequence[Task]
) -> dict[str, RolloutResult]:
    """Every task as a rollout at once (isolation shows), against `policy` over real HTTP."""
    async with PolicyServer(policy) as server:
        model = ModelConfig(base_url=server.url)
        results = await asyncio.gather(
            *(
                run_rollout(client, RolloutInput(env=str(env), task=t, model=model), task_queue=worker.task_queue)
                for t in tasks
            )
        )
    return {r.task_id: r for r in results}


def last_tool(messages: Sequence[Message]) -> str:
    return next(m.content for m in reversed(messages) if m.role == "tool")


# -- git: a repository per rollout --------------------------------------------------------------


class GitPolicy(Policy):
    """Creates the asked-for branch, reads the log, answers with the last commit's subject."""

    name = "git"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        repo = re.search(r"repository at (\S+)\.", messages[0].content)
        branch = re.search(r"branch named (\S+),", messages[1].content)
        assert repo is not None and branch is not None and "git_create_branch" in {t.name for t in tools}
        if not any(m.role == "tool" for m in messages):
            return Message(
                role="assistant",
                tool_calls=[
                    call("git_create_branch", {"repo_path": repo.group(1), "branch_name": branch.group(1)}),
                    call("git_log", {"repo_path": repo.group(1), "max_count": 1}),
                ],
            )
        subject = re.search(r"Message: (.*)", last_tool(messages))
        return Message(role="assistant", content=f"It is <answer>{subject.group(1) if subject else '?'}</answer>.")


GIT_REWARD = '''
def only_its_branch(completion, ground_truth, workspace, metadata, **kwargs):
    """The rollout's repository has its own new branch and no other rollout's."""
    heads = {p.name for p in (workspace / ".git" / "refs" / "heads").iterdir()}
    return float(heads == {"main", metadata["branch"]})
'''


async def test_git_server_on_a_seeded_repository(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    server = third_party("git")
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "README.md").write_text("# demo\n")
    (tmp_path / "rewards.py").write_text(GIT_REWARD)
    env = tmp_path / "git.yaml"
    env.write_text(
        textwrap.dedent(f"""
        mcpServers:
          git:
            command: {server}
            args: [--repository, "{{workspace}}"]
        system_prompt: You work in the git repository at {{workspace}}. Pass that path as repo_path.
        workspace:
          files: {{README.md: seed/README.md}}
          setup: git init -q -b main && git add -A && git -c user.name=seed -c user.email=seed@example.com commit -qm "initial commit"
        reward:
          - {{fn: exact_match, extract: answer_tag}}
          - rewards.py:only_its_branch
        """)  # noqa: E501
    )
    tasks = [
        Task(
            id=f"branch-{name}",
            prompt=f"Create a branch named {name}, then tell me the subject of the latest commit.",
            ground_truth="initial commit",
            metadata={"branch": name},
        )
        for name in ("feature-a", "feature-b")
    ]
    results = await run_all(client, worker, GitPolicy(), env, tasks)
    for task in tasks:
        result = results[task.id]
        assert not result.infra_failed, result.error
        assert result.reward is not None
        assert result.reward.components == {"exact_match": 1.0, "only_its_branch": 1.0}, result.messages


# -- SQLite: a database file per rollout --------------------------------------------------------


class SqlPolicy(Policy):
    """Runs the prompt's `statements` one per turn, then answers with the last number read."""

    name = "sql"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        statements = re.findall(r"`([^`]+)`", messages[1].content)
        done = sum(m.role == "tool" for m in messages)
        if done < len(statements):
            sql = statements[done]
            tool = "read_query" if sql.lstrip().upper().startswith("SELECT") else "write_query"
            return Message(role="assistant", tool_calls=[call(tool, {"query": sql})])
        number = re.findall(r"-?\d+(?:\.\d+)?", last_tool(messages))
        return Message(role="assistant", content=f"<answer>{number[-1] if number else '?'}</answer>")


async def test_sqlite_server_on_a_seeded_database(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    server = third_party("sqlite")
    with sqlite3.connect(tmp_path / "shop.db") as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT, price REAL)")
        db.executemany("INSERT INTO orders (item, price) VALUES (?, ?)", [("pen", 1.5), ("book", 12), ("lamp", 30.25)])
    env = tmp_path / "shop.yaml"
    env.write_text(
        textwrap.dedent(f"""
        mcpServers:
          shop:
            command: {server}
            args: [--db-path, "{{workspace}}/shop.db"]
        system_prompt: Answer from the shop database with SQL. End with <answer>NUMBER</answer>.
        workspace: {{files: {{shop.db: shop.db}}}}
        reward: {{fn: numeric_close, extract: answer_tag, args: {{rel_tol: 1.0e-9}}}}
        """)
    )
    count, insert = "SELECT COUNT(*) FROM orders", "INSERT INTO orders (item, price) VALUES ('cup', 4)"
    tasks = [
        Task(id="insert", prompt=f"Run `{insert}`, then `{count}`.", ground_truth=4),
        Task(id="count", prompt=f"Answer `{count}`.", ground_truth=3),  # the other rollout's insert is not here
        Task(id="total", prompt="Answer `SELECT SUM(price) FROM orders`.", ground_truth="43.75"),
    ]  # fmt: skip
    results = await run_all(client, worker, SqlPolicy(), env, tasks)
    for task in tasks:
        result = results[task.id]
        assert not result.infra_failed, result.error
        assert result.reward is not None and result.reward.components == {"numeric_close": 1.0}, result.messages
    with sqlite3.connect(tmp_path / "shop.db") as db:  # the seed itself is never written to
        assert db.execute(count).fetchone() == (3,)


# -- time: stateless conversions, scored by the default reward ----------------------------------


class TimePolicy(Policy):
    """Converts the prompt's time with `convert_time` and answers HH:MM in an <answer> tag."""

    name = "time"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        asked = re.search(r"Convert (\d\d:\d\d) from (\S+) to (\S+)\.", messages[1].content)
        assert asked is not None
        if not any(m.role == "tool" for m in messages):
            arguments = {"time": asked.group(1), "source_timezone": asked.group(2), "target_timezone": asked.group(3)}
            return Message(role="assistant", tool_calls=[call("convert_time", arguments)])
        target = json.loads(last_tool(messages))["target"]["datetime"]
        return Message(role="assistant", content=f"That is <answer>{target[11:16]}</answer> there.")


async def test_time_server_scored_by_the_default_reward(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    server = third_party("time")
    env = tmp_path / "time.yaml"
    env.write_text(
        textwrap.dedent(f"""
        mcpServers:
          time:
            command: {server}
            args: [--local-timezone, UTC]
        system_prompt: Convert times with the tools. End with <answer>HH:MM</answer>.
        stateless: true
        """)
    )
    # Zones without daylight saving time: the answers do not depend on the day the test runs.
    tasks = [
        Task(id="kolkata", prompt="Convert 09:30 from UTC to Asia/Kolkata.", ground_truth="15:00"),
        Task(id="tokyo", prompt="Convert 23:15 from UTC to Asia/Tokyo.", ground_truth="08:15"),
    ]
    results = await run_all(client, worker, TimePolicy(), env, tasks)
    for task in tasks:
        result = results[task.id]
        assert not result.infra_failed, result.error
        assert result.reward is not None and result.reward.components == {"exact_match": 1.0}, result.messages
