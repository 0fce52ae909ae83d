"""The agentic judge (RolloutInput.agentic_judge): a judge model with tools, run as a child rollout of
the workspace-judge env on the judged rollout's node, that checks the rollout's database instead of
believing its transcript."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from mcp_support import wait_until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from gymflow.activities.model import ModelConfig
from gymflow.activities.names import SA_STATUS
from gymflow.activities.schema import AgenticJudgeConfig, RolloutInput, RolloutResult
from gymflow.envs.builtin.crm_support.policy import ReferenceAgent
from gymflow.envs.builtin.crm_support.tasks import generate_tasks
from gymflow.envs.builtin.workspace_judge.env import WorkspaceJudgeEnv, snapshot
from gymflow.envs.contract import Message, TerminationReason, ToolCall, ToolSpec
from gymflow.envs.policy import Policy
from gymflow.envs.rewards.agentic import score_of
from gymflow.workers.sdk.client import start_rollout
from gymflow.workers.servers.policy import AppServer, PolicyServer
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, play

REFUND = generate_tasks(1, seed=0)[0]


# --8<-- [start:judge]
class RefundChecker(Policy):
    """A judge that lists the workspace, queries the refunds, and scores 1 iff one was made."""

    name = "refund-checker"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        done = [m for m in messages if m.role == "tool"]
        if not done:
            return Message(role="assistant", tool_calls=[ToolCall(id="j1", name="list_files", arguments={})])
        if len(done) == 1:
            query = {"path": "support.db", "sql": "SELECT order_id, amount_cents FROM refunds"}
            return Message(role="assistant", tool_calls=[ToolCall(id="j2", name="query_db", arguments=query)])
        rows = json.loads(done[-1].content)["rows"]
        return Message(
            role="assistant", content=f"{len(rows)} refund(s) in the database. <score>{int(bool(rows))}</score>"
        )


# --8<-- [end:judge]


class Mumbler(Policy):
    name = "mumbler"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        return Message(role="assistant", content="It looks fine to me.")


# --8<-- [start:run]
async def _judged(client: Client, worker: RunningWorker, agent: Policy, judge: Policy) -> RolloutResult:
    async with PolicyServer(judge) as server:
        config = AgenticJudgeConfig(model=ModelConfig(base_url=server.url))
        return await play(client, worker, agent, env="crm-support", task=REFUND, agentic_judge=config)


# --8<-- [end:run]


async def test_the_judge_checks_the_workspace_and_adds_its_score(client: Client, worker: RunningWorker) -> None:
    result = await _judged(client, worker, ReferenceAgent(), RefundChecker())
    assert not result.infra_failed and result.reward is not None, result.error
    assert result.reward.components["judge/judge"] == 1.0
    assert result.reward.total == 2.0, "the env's 1 plus the judge's 1 (combine: add)"
    child = await client.get_workflow_handle(f"{result.rollout_id}/judge", result_type=RolloutResult).result()
    assert [m.name for m in child.messages if m.role == "tool"] == ["list_files", "query_db"]
    listing = json.loads(next(m.content for m in child.messages if m.name == "list_files"))
    assert "support.db" in {f["path"] for f in listing["files"]}, "the judged rollout's own files"
    assert "1 refund(s)" in child.messages[-1].content
    assert child.env == "workspace-judge" and child.task_id == f"{REFUND.id}:judge"


async def test_a_claim_the_workspace_does_not_back_scores_zero(client: Client, worker: RunningWorker) -> None:
    amount = REFUND.ground_truth["amount"]
    liar = ScriptedPolicy([Message(role="assistant", content=f"I refunded ${amount:,.2f} for your order.")])
    result = await _judged(client, worker, liar, RefundChecker())
    assert result.reward is not None and result.reward.total == 0.0
    assert result.reward.components["judge/judge"] == 0.0, "no refund in the database: the judge is not fooled"


@pytest.mark.heavy  # a third judged rollout
async def test_a_judge_without_a_score_leaves_the_rollout_infra_failed(client: Client, worker: RunningWorker) -> None:
    result = await _judged(client, worker, ReferenceAgent(), Mumbler())
    assert result.infra_failed and result.reward is None and result.termination == TerminationReason.REWARD_ERROR
    assert "without a <score>" in (result.error or "")


async def test_the_judge_reads_only_rollout_workspaces(tmp_path: Path) -> None:
    env = WorkspaceJudgeEnv(workspace_root=tmp_path / "node" / "workspace-judge")
    (tmp_path / "node" / "crm" / "not-a-workspace").mkdir(parents=True)
    (tmp_path / "elsewhere" / "crm" / "ws-1").mkdir(parents=True)
    (tmp_path / "node" / "crm" / "ws-link").symlink_to(tmp_path / "elsewhere" / "crm" / "ws-1")
    crm = tmp_path / "node" / "crm"
    bad = ["/etc", tmp_path, tmp_path / "node", crm, crm / "not-a-workspace", crm / "ws-missing",
           tmp_path / "elsewhere" / "crm" / "ws-1", crm / "ws-link"]  # fmt: skip
    for source in map(str, bad):
        with pytest.raises(ValueError, match="is not a rollout workspace"):
            await env.init_rollout("r1", source=source)
    with pytest.raises(ValueError, match="need 'source'"):
        await env.init_rollout("r1")


def test_the_snapshot_is_a_read_only_copy_without_links(tmp_path: Path) -> None:
    source, target = tmp_path / "ws", tmp_path / "snap"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.txt").write_text("hello")
    (source / "out").symlink_to("/etc/passwd")
    (source / "dir-link").symlink_to(tmp_path)
    os.mkfifo(source / "pipe")
    assert snapshot(source, target) == 5
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == ["sub", "sub/a.txt"]
    assert (target / "sub" / "a.txt").stat().st_mode & 0o777 == 0o444
    with pytest.raises(ValueError, match="more than 4 bytes"):
        snapshot(source, tmp_path / "small", max_bytes=4)


def test_the_score_is_read_strictly() -> None:
    assert score_of("checked. <score>0.5</score>") == 0.5
    assert score_of("<score>0</score> then <score>1</score>") == 1.0
    for bad in ("no score", "<score>1.5</score>", "<score>high</score>"):
        with pytest.raises(ValueError):
            score_of(bad)


def held_judge(calls: list[int], gate: asyncio.Event) -> Starlette:
    """A judge endpoint whose first call waits for `gate` (a judge turn in flight)."""

    async def completions(request: Request) -> Response:
        await request.body()
        calls.append(1)
        await gate.wait()
        message = {"role": "assistant", "content": "<score>1</score>"}
        return JSONResponse({"model": "judge", "choices": [{"index": 0, "message": message}]})

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


async def test_a_rollout_cancelled_while_its_judge_runs_closes_cancelled_and_frees_both(
    client: Client, worker: RunningWorker
) -> None:
    calls: list[int] = []
    gate = asyncio.Event()
    async with PolicyServer(ReferenceAgent()) as agent, AppServer(held_judge(calls, gate)) as judge:
        config = AgenticJudgeConfig(model=ModelConfig(base_url=judge.url))
        handle = await start_rollout(
            client,
            RolloutInput(env="crm-support", task=REFUND, model=ModelConfig(base_url=agent.url), agentic_judge=config),
            task_queue=worker.task_queue,
        )
        await wait_until(lambda: len(calls) == 1, timeout_s=60, what="the judge's first turn in flight")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        gate.set()
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.CANCELED
    assert described.typed_search_attributes.get(SA_STATUS) == "cancelled"
    child = await client.get_workflow_handle(f"{handle.id}/judge").describe()
    assert child.status == WorkflowExecutionStatus.CANCELED
    judged, judging = worker.env.env("crm-support"), worker.env.env("workspace-judge")
    await wait_until(
        lambda: not judged.live_rollouts() and not judging.live_rollouts(),  # type: ignore[attr-defined]
        what="both rollouts' servers and workspaces released",
    )
