"""Env files: the default reward reads the final answer, reward-library functions by name with their
parameters, signatures checked when the file loads, placeholders in prompts, seeded workspaces."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from gymflow.envs.contract import Message, Task
from gymflow.envs.envfile import env_from_file
from gymflow.envs.errors import EnvFileError, InfraError
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.mcp.library_reward import LibraryReward, LibraryRewardSpec, extracted
from gymflow.workers.worker import RunningWorker
from support import COUNTER_SERVER, ScriptedPolicy, call, play

SERVERS = f"""
mcpServers:
  counter:
    command: python
    args: [{json.dumps(str(COUNTER_SERVER))}]
"""


def env_file(tmp_path: Path, body: str, name: str = "env.yaml") -> Path:
    path = tmp_path / name
    path.write_text(SERVERS + textwrap.dedent(body))
    return path


def load(path: Path, tmp_path: Path) -> McpEnv:
    return env_from_file(path, workspace_root=tmp_path / "ws", pool_size=0)


def said(text: str) -> list[Message]:
    return [Message(role="user", content="q"), Message(role="assistant", content=text)]


async def score(env: McpEnv, text: str, truth: Any) -> dict[str, float]:
    await env.init_rollout("r")
    try:
        reward = await env.compute_reward("r", said(text), truth)
    finally:
        await env.release_rollout("r")
    assert isinstance(reward, dict) or hasattr(reward, "components")
    return dict(reward) if isinstance(reward, dict) else reward.components  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "truth", "expected"),
    [
        ("Done. <answer>3:6</answer>", "3:6", 1.0),  # the case: it scored 0 before
        ("<answer>X</answer>", "X", 1.0),
        ("<answer>42</answer>", 42, 1.0),  # a number from the dataset
        ("  3:6 ", "3:6", 1.0),  # no tag: the message whole
        ("I think <answer>3:5</answer>, no wait: <answer>3:6</answer>", "3:6", 1.0),  # the last tag
        ("Done. <answer>3:5</answer>", "3:6", 0.0),
        ("<answer>x</answer>", None, 0.0),  # no ground truth
    ],
)
async def test_default_reward_compares_the_final_answer(tmp_path: Path, text: str, truth: Any, expected: float) -> None:
    env = load(env_file(tmp_path, "system_prompt: hi\n"), tmp_path)
    try:
        assert await score(env, text, truth) == {"exact_match": expected}
    finally:
        await env.shutdown()


def test_a_library_function_as_a_plain_reward_is_refused_when_the_file_loads(tmp_path: Path) -> None:
    path = env_file(tmp_path, "reward: gymflow.envs.rewards.text:exact_match\n")
    with pytest.raises(EnvFileError) as info:
        load(path, tmp_path)
    message = str(info.value)
    assert "exact_match(pred" in message  # the function's own signature
    assert "reward_fn(completion, ground_truth, workspace, mcp_client, **kwargs)" in message  # the one it needs
    assert "{fn: exact_match" in message  # and how to use it instead


@pytest.mark.parametrize(
    ("reward", "needle"),
    [
        ("{fn: numeric_close, args: {tol: 0.1}}", "fn(prediction, ground_truth, **args)"),
        ("{fn: numeric_close, args: {tol: 0.1}}", "unexpected keyword argument 'tol'"),
        ("{check: tag_format_score}", "missing a required argument: 'tags'"),
        ("{fn: no_such_reward}", "no function 'no_such_reward' in the reward library"),
        ("{fn: exact_match, check: tag_format_score}", "exactly one of 'fn'"),
        ("{fn: exact_match, extract: first_line}", "'extract' must be one of"),
        ("[rewards.py:two_args]", "reward[0]: rewards.py:two_args is two_args(completion, ground_truth)"),
    ],
)
def test_a_reward_that_cannot_work_is_a_load_error_naming_the_signature(
    tmp_path: Path, reward: str, needle: str
) -> None:
    (tmp_path / "rewards.py").write_text("def two_args(completion, ground_truth):\n    return 1.0\n")
    with pytest.raises(EnvFileError) as info:
        load(env_file(tmp_path, f"reward: {reward}\n"), tmp_path)
    assert needle in str(info.value) and "env.yaml" in str(info.value)


async def test_library_functions_with_parameters_weights_and_names(tmp_path: Path) -> None:
    path = env_file(
        tmp_path,
        """
        reward:
          - {fn: numeric_close, extract: answer_tag, args: {rel_tol: 0.01}, name: close}
          - {check: tag_format_score, args: {tags: [answer]}, weight: 0.5, name: format}
          - {fn: normalized_match, extract: "tag:final"}
        """,
    )
    env = load(path, tmp_path)
    try:
        assert await score(env, "<answer>100.5</answer><final>The Paris!</final>", "100") == {
            "close": 1.0,
            "format": 0.5,
            "normalized_match": 0.0,
        }
        assert await score(env, "no tags", "100") == {"close": 0.0, "format": 0.0, "normalized_match": 0.0}
        assert (await score(env, "<final>paris</final>", "The Paris!"))["normalized_match"] == 1.0
    finally:
        await env.shutdown()


def test_extract_rules() -> None:
    assert extracted("a <answer>\\boxed{7}</answer>", "answer") == "7"
    assert extracted("plain", "answer") == "plain" and extracted("plain", "answer_tag") is None
    assert extracted("x \\boxed{1+1} y", "boxed") == "1+1" and extracted("x", "boxed") is None
    assert extracted(" whole <answer>1</answer> ", "text") == "whole <answer>1</answer>"
    reward = LibraryReward(LibraryRewardSpec(fn="exact_match", extract="answer"))
    assert reward("<answer>a</answer>", ["b", "a"]) == 1.0  # several references


async def test_placeholders_and_a_seeded_workspace_in_a_real_rollout(
    client: Client, worker: RunningWorker, tmp_path: Path
) -> None:
    seed = tmp_path / "seed"
    (seed / "docs").mkdir(parents=True)
    (seed / "docs" / "readme.md").write_text("hello")
    (tmp_path / "data.csv").write_text("a,b\n")
    (tmp_path / "rewards.py").write_text(
        "def setup_saw_workspace(completion, ground_truth, workspace, **kwargs):\n"
        "    return float((workspace / 'setup.txt').read_text().strip() == str(workspace))\n"
    )
    path = env_file(
        tmp_path,
        """
        system_prompt: "Your files are in {workspace}; you are rollout {rollout_id}. JSON stays: {\\"k\\": 1}"
        reward: [{fn: exact_match}, rewards.py:setup_saw_workspace]
        workspace:
          files: {input/data.csv: data.csv, docs: seed/docs}
          setup: 'test -f input/data.csv && echo "$GYMFLOW_WORKSPACE" > setup.txt'
        """,
    )
    tasks = [Task(id="t", prompt="List {workspace}. <answer>", ground_truth="4")]
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("list_files")]),
            Message(role="assistant", content="Done. <answer>4</answer>"),
        ]
    )
    result = await play(client, worker, script, env=str(path), task=tasks[0])
    assert not result.infra_failed, result.error
    system, user = result.messages[0].content, result.messages[1].content
    workspace = system.split("Your files are in ")[1].split(";")[0]
    assert Path(workspace).is_relative_to(worker.settings.workspace_root) and Path(workspace).name.startswith("ws-")
    assert f"you are rollout {result.rollout_id}." in system and '{"k": 1}' in system
    assert user == f"List {workspace}. <answer>"
    assert result.messages[3].content.split() == ["docs", "input", "setup.txt"]  # seeded before the server
    assert result.reward is not None and result.reward.components == {"exact_match": 1.0, "setup_saw_workspace": 1.0}


async def test_setup_output_and_timeouts_fail_the_server_set(tmp_path: Path) -> None:
    failing = load(env_file(tmp_path, "workspace: {setup: 'echo broken >&2; exit 3'}\n", "a.yaml"), tmp_path)
    slow = load(env_file(tmp_path, "workspace: {setup: [sleep, '30'], setup_timeout_s: 0.5}\n", "b.yaml"), tmp_path)
    try:
        with pytest.raises(InfraError, match="exited with code 3: broken"):
            await failing.init_rollout("r")
        with pytest.raises(InfraError, match=r"timed out after 0\.5s"):
            await slow.init_rollout("r")
        assert not [p for p in (tmp_path / "ws").iterdir() if p.name.startswith("ws-")]  # nothing left behind
    finally:
        await failing.shutdown()
        await slow.shutdown()


def test_seed_files_are_checked_when_the_file_loads(tmp_path: Path) -> None:
    with pytest.raises(EnvFileError, match=r"workspace\.files\.x: no such file"):
        load(env_file(tmp_path, "workspace: {files: {x: missing.txt}}\n"), tmp_path)
    with pytest.raises(EnvFileError, match="must be a relative path inside the workspace"):
        load(env_file(tmp_path, "workspace: {files: {../x: env.yaml}}\n"), tmp_path)
