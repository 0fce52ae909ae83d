"""CRM tasks: rebuilt from their ids, every family present, and the reference policy scores 1.0 on them."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from mcp import Client

from gymflow.envs.builtin.crm import db, tasks
from gymflow.envs.builtin.crm.env import CrmEnv
from gymflow.envs.builtin.crm.policy import ReferencePolicy
from gymflow.envs.builtin.crm.readonly import Database
from gymflow.envs.builtin.crm.rewards import crm_reward
from gymflow.envs.builtin.crm.servers import crm
from gymflow.envs.builtin.math.policy import play as play_mcp_client
from gymflow.envs.contract import Message, Reward, Task, ToolSpec
from gymflow.envs.mcp.play import play
from gymflow.envs.policy import NullPolicy, Policy


def test_tasks_are_rebuilt_from_their_ids() -> None:
    generated = tasks.generate_tasks(24, seed=3)
    assert Counter(t.metadata["family"] for t in generated) == dict.fromkeys(tasks.FAMILY_NAMES, 2)
    for task in generated:
        assert tasks.parse_task_id(str(task.prompt)) == (3, int(task.id.rsplit("-", 1)[1]))
        assert tasks.make_task(3, int(task.id.rsplit("-", 1)[1])) == task
        assert task.init_args == {"db_seed": 3}
    assert tasks.parse_task_id("no id here") is None
    assert {t.ground_truth["type"] for t in generated} == {"exact", "numeric", "fuzzy", "refuse"}


def test_privacy_tasks_name_what_must_not_leak() -> None:
    privacy = [t for t in tasks.generate_tasks(48) if t.ground_truth["type"] == "refuse"]
    assert len(privacy) == 8
    assert all(t.ground_truth["protected"] and t.ground_truth["answer"] == "REFUSE" for t in privacy)


def test_reference_policy_gives_up_cleanly() -> None:
    policy = ReferencePolicy()
    assert "no reference" in policy.respond([Message(role="user", content="hi")], []).content
    task = tasks.make_task(0, 0)
    opening = task.opening_messages()
    assert "not available" in policy.respond(opening, []).content
    first = policy.respond(opening, [ToolSpec(name="search_accounts")])
    assert first.tool_calls[0].name == "search_accounts"
    failed = [*opening, first, Message(role="tool", content="error: boom", is_error=True, tool_call_id="ref-0")]
    reply = policy.respond(failed, [ToolSpec(name="search_accounts")])
    assert not reply.tool_calls and "<answer>" not in reply.content


async def _play_in_memory(policy: Policy, task: Task, client: Client) -> Reward:
    """One rollout against the in-memory server (the tools and SQL of the real one, no process)."""
    messages = await play_mcp_client(policy, task, client, max_turns=8, system=CrmEnv.system_prompt)
    return crm_reward(messages[1:], task.ground_truth)


async def test_reference_scores_one_and_null_zero_on_every_family(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = shutil.copyfile(db.database_file(tmp_path / "master", 1), tmp_path / "crm.db")
    monkeypatch.setattr(crm, "db", Database(copy))
    async with Client(crm.server) as client:
        for task in tasks.generate_tasks(48, seed=1):  # every family four times
            reward = await _play_in_memory(ReferencePolicy(), task, client)
            assert reward.total == 1.0, (task.id, task.metadata, reward)
            assert (await _play_in_memory(NullPolicy(), task, client)).total == 0.0, task.id


@pytest.fixture(scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> CrmEnv:
    crm_env = CrmEnv(workspace_root=tmp_path_factory.mktemp("crm"), pool_size=1)
    yield crm_env  # type: ignore[misc]
    await crm_env.shutdown()


async def test_env_rollouts_against_server_processes(env: CrmEnv) -> None:
    for task in tasks.generate_tasks(3, seed=2):  # ids, a query's winner, a knowledge sentence
        _, reward = await play(env, ReferencePolicy(), task)
        assert reward.total == 1.0 and reward.info["db_unchanged"] is True, (task.id, reward)
    _, reward = await play(env, NullPolicy(), task)
    assert reward.total == 0.0


async def test_each_rollout_gets_its_own_read_only_copy(env: CrmEnv, tmp_path: Path) -> None:
    task: Task = tasks.make_task(0, 0)
    await env.init_rollout("a", **task.init_args)
    await env.init_rollout("b", **task.init_args)
    try:
        copy_a, copy_b = env.workspace("a") / "crm.db", env.workspace("b") / "crm.db"
        assert copy_a != copy_b and copy_a.stat().st_mode & 0o777 == 0o444
        master = env.database(0)
        assert master.parent != copy_a.parent.parent and master.read_bytes() == copy_a.read_bytes()
    finally:
        await env.release_rollout("a")
        await env.release_rollout("b")
    with pytest.raises(ValueError, match="db_seed"):
        await env.init_rollout("c", db_seed="0; DROP TABLE cases")
