"""Envs from config alone: an env file runs real rollouts by its path, with a server-side reward."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from temporalio.client import Client

from gymflow.envs.contract import Message, Task
from gymflow.envs.envfile import env_from_file
from gymflow.workers.worker import RunningWorker
from support import COUNTER_SERVER, ScriptedPolicy, call, play

REWARD = '''
from pathlib import Path

async def counter_matches(completion, ground_truth, workspace, mcp_client, **kwargs):
    """Reads the live server's state through a tool, and a file the model had it write."""
    value = await mcp_client.call_tool("get")
    return {"counter": float(value.text == str(ground_truth)),
            "note": float((Path(workspace) / "note.txt").is_file())}

def said_done(completion, ground_truth, **kwargs):
    return float(completion == "done" and kwargs["messages"][0].role == "system")
'''


def write_env(tmp_path: Path) -> Path:
    (tmp_path / "rewards.py").write_text(REWARD)
    (tmp_path / "tasks.jsonl").write_text('{"id": "to-5", "prompt": "count to 5", "answer": "5"}\n')
    path = tmp_path / "counter.yaml"
    path.write_text(
        textwrap.dedent(f"""
        mcpServers:
          counter:
            command: python
            args: [{json.dumps(str(COUNTER_SERVER))}]
            parsers: {{pid: json}}
        system_prompt: Count with the tools.
        reward: [rewards.py:counter_matches, rewards.py:said_done]
        dataset: tasks.jsonl
        replayable: true
        """)
    )
    return path


async def test_env_file_rollout_with_a_reward_that_calls_tools(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    path = write_env(tmp_path)
    env_cls = type(env_from_file(path, workspace_root=tmp_path / "probe", pool_size=0))
    (task,) = env_cls.load_dataset("default")
    assert task == Task(id="to-5", prompt="count to 5", ground_truth="5")
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("increment", {"by": 2}), call("increment", {"by": 3})]),
            Message(role="assistant", tool_calls=[call("write_note", {"name": "note.txt", "text": "hi"})]),
            Message(role="assistant", content="done"),
        ]
    )
    result = await play(client, worker, script, env=str(path), task=task)
    assert result.env == str(path) and not result.infra_failed
    assert result.messages[0].content == "Count with the tools."
    assert result.reward is not None and result.reward.components == {"counter": 1.0, "note": 1.0, "said_done": 1.0}
    assert result.reward.total == 3.0
    held = worker.env.env(str(path))
    assert held.replayable and not held.stateless and held.live_rollouts() == []  # type: ignore[attr-defined]


async def test_missing_env_file_fails_the_rollout_at_once(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    from temporalio.client import WorkflowFailureError

    script = ScriptedPolicy([Message(role="assistant", content="done")])
    try:
        await play(client, worker, script, env=str(tmp_path / "absent.yaml"), task=Task(id="t", prompt="p"))
    except WorkflowFailureError as exc:
        assert "absent.yaml: env file not found" in str(exc.cause)
    else:
        raise AssertionError("a rollout of a missing env file must fail")


def test_an_env_file_sets_its_workspace_quota_over_the_workers_default(tmp_path: Path) -> None:
    path = write_env(tmp_path)
    path.write_text(path.read_text() + "workspace_quota_mb: 7\n")
    env = env_from_file(path, workspace_root=tmp_path / "ws", default_workspace_quota_mb=1024)
    assert env.quota_mb == 7
    (tmp_path / "plain").mkdir()
    plain = write_env(tmp_path / "plain")
    assert env_from_file(plain, workspace_root=tmp_path / "ws2", default_workspace_quota_mb=33).quota_mb == 33
