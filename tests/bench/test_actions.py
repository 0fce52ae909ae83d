"""bench.actions on real histories: one rollout per plan through a real worker and dev server."""

from __future__ import annotations

import uuid

from temporalio.client import Client

from bench.actions import PLANS, count_plans, plan_input, rollout_input
from bench.workload import BenchPolicy
from gymflow.workers.servers.policy import AppServer, build_app
from gymflow.workers.worker import RunningWorker


async def test_counts_of_the_three_plans(client: Client, worker: RunningWorker) -> None:
    from bench.workload import LatencyMiddleware

    async with AppServer(LatencyMiddleware(build_app(BenchPolicy()))) as server:
        base = server.url.removesuffix("/v1")
        rows = await count_plans(client, base, tool_turns=4, task_queue=worker.task_queue, plans=PLANS,
                                 id_prefix=f"test-actions-{uuid.uuid4().hex[:8]}")  # fmt: skip
    classic, local, fused = rows["classic"], rows["local"], rows["fused"]
    assert classic["activities_by_type"] == {"init_rollout": 1, "generate": 5, "call_tool": 4, "compute_reward": 1}
    assert classic["workflow_tasks"] >= 12  # one per activity completion, plus the first
    assert classic["local_activities"] == 0
    assert classic["markers_by_name"] == {}  # the SDK declares the plan in the memo: no patch marker
    assert classic["search_attribute_upserts"] == 1  # status and reward at the end; no TemporalChangeVersion
    # start + 11 activity starts + the upserts left to the workflow (status at the end, termination memo is free)
    assert classic["billable"]["activity_starts_and_retries"] == 11
    assert classic["billable_actions"] == 1 + 11 + classic["search_attribute_upserts"]
    assert classic["state_transitions"] > classic["workflow_tasks"]
    assert local["activities_by_type"] == {"init_rollout": 1, "call_tool": 4, "compute_reward": 1}
    assert local["local_activities"] == 5 and local["markers"] == 5  # the turns' markers only
    assert local["billable"]["local_activity_workflow_tasks"] == 5  # one model turn per workflow task
    assert local["workflow_tasks"] < classic["workflow_tasks"]
    assert local["history_bytes"] < classic["history_bytes"]
    # fused: one activity per turn (the tool call inside it, the reward inside the last one)
    assert fused["activities_by_type"] == {"init_rollout": 1, "play_turn": 5}
    assert fused["billable_actions"] == 1 + 6 + fused["search_attribute_upserts"]
    assert fused["state_transitions"] < classic["state_transitions"]


def test_a_plan_with_a_field_rollout_input_lacks_is_skipped() -> None:
    base = rollout_input("http://127.0.0.1:1", 4, 0)
    assert plan_input(base, {"no_such_field": True}) is None
    local = plan_input(base, {"model": {"local_activity": True}})
    assert local is not None and local.model.local_activity and local.model.base_url == base.model.base_url
