"""Actions per rollout, counted from real histories: `python -m bench.actions [--tool-turns 4]`.

Runs ONE rollout of the benchmark env (`bench.workload`, zero-latency endpoint) per rollout plan
through the real gymflow worker (its own process, the dev server as `gymflow server` runs it) and
counts from the rollout's history what the server and Temporal Cloud see: activities scheduled
(by type) and their attempts, workflow tasks, markers (local-activity and patch markers), upserts
(search attributes, memo), timers, child workflows, signals, events, history bytes, the server's
own count of mutable-state transitions (each one a persistence write on the workflow's shard,
`DescribeWorkflowExecution.state_transition_count`) and billable Temporal Cloud actions.

Billable actions follow https://docs.temporal.io/cloud/actions (temporalio/documentation,
docs/evaluate/temporal-cloud/actions.mdx): workflow started 1; each activity start or retry 1;
local activities: 1 per workflow task that records any (all RecordMarker commands of a workflow
task count as one); each UpsertSearchAttributes command 1 (attributes set at start are excluded);
timers, signals 1 each; a child workflow 2 (start + execution). Patch markers, memo upserts
(WorkflowPropertiesModified) and workflow tasks themselves are not in that list and are not
counted. Activity heartbeats that reach the server are billable but are not in history; each is
a state transition, so `--probe 5 12 20` runs a 1-tool-turn classic rollout per model latency and
reports the transitions its heartbeats added per turn, against `bench.scale_model.heartbeats_per_turn`,
which the sizing uses (zero-latency turns never heartbeat).

Plans are `(label, overrides)`: the overrides are merged into the rollout's `RolloutInput` (as
its JSON form), so a new plan is one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from bench.procs import Procs, load, start_policy, start_server, start_worker
from bench.scale_model import Assumptions, heartbeats_per_turn
from bench.workload import ENV_NAME, bench_task, endpoint
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput, RolloutLimits
from gymflow.workers.client import connect
from gymflow.workers.sdk import client as sdk

OUT = Path(__file__).resolve().parent / "out"
QUEUE = "bench-actions"
LOCAL_ACTIVITY_MARKER = "core_local_activity"
PLANS: list[tuple[str, dict[str, Any]]] = [
    ("classic", {"fuse_turns": False}),
    ("local", {"model": {"local_activity": True}, "fuse_turns": False}),
    ("fused", {"fuse_turns": True}),
]
"""Rollout plans: label -> overrides of RolloutInput. One activity per model turn and per tool call
(classic; the bench env fuses by default, so it is asked not to), model turns as local activities,
one activity per turn (fused: gymflow.activities.turn). A plan whose fields RolloutInput lacks (an older
commit) is reported as skipped, not run."""


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in, nested mappings merged key by key."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def plan_input(base: RolloutInput, overrides: Mapping[str, Any]) -> RolloutInput | None:
    """The rollout input of a plan, or None when RolloutInput lacks one of the override's fields."""
    if any(key not in RolloutInput.model_fields for key in overrides):
        return None
    return RolloutInput.model_validate(merged(base.model_dump(mode="json"), overrides))


def count_history(history: WorkflowHistory) -> dict[str, Any]:
    """What one workflow run's history holds, by kind, and its billable Temporal Cloud actions."""
    activities: Counter[str] = Counter()
    markers: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    attempts = 0
    wft = 0  # the current workflow task (its WorkflowTaskCompleted event id)
    local_wfts: set[int] = set()
    for event in history.events:
        kind = event.event_type
        kinds[EventType.Name(kind)] += 1
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activities[event.activity_task_scheduled_event_attributes.activity_type.name] += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attempts += max(1, event.activity_task_started_event_attributes.attempt)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            wft = event.event_id
        elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
            name = event.marker_recorded_event_attributes.marker_name
            markers[name] += 1
            if name == LOCAL_ACTIVITY_MARKER:
                local_wfts.add(wft)

    def n(name: str) -> int:
        return kinds[f"EVENT_TYPE_{name}"]

    children = n("START_CHILD_WORKFLOW_EXECUTION_INITIATED")
    billable = {
        "workflow_started": 1,
        "activity_starts_and_retries": attempts,
        "local_activity_workflow_tasks": len(local_wfts),
        "search_attribute_upserts": n("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"),
        "timers": n("TIMER_STARTED"),
        "signals": n("WORKFLOW_EXECUTION_SIGNALED"),
        "child_workflows": 2 * children,
    }
    return {
        "activities": sum(activities.values()),
        "activities_by_type": dict(activities),
        "activity_attempts": attempts,
        "workflow_tasks": n("WORKFLOW_TASK_SCHEDULED"),
        "markers": sum(markers.values()),
        "markers_by_name": dict(markers),
        "local_activities": markers[LOCAL_ACTIVITY_MARKER],
        "search_attribute_upserts": n("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"),
        "memo_upserts": n("WORKFLOW_PROPERTIES_MODIFIED"),
        "timers": n("TIMER_STARTED"),
        "child_workflows": children,
        "signals": n("WORKFLOW_EXECUTION_SIGNALED"),
        "events": len(history.events),
        "history_bytes": sum(event.ByteSize() for event in history.events),
        "billable": billable,
        "billable_actions": sum(billable.values()),
        # activities + workflow tasks + markers: the unit the issue counts "actions" in
        "actions": sum(activities.values()) + n("WORKFLOW_TASK_SCHEDULED") + sum(markers.values()),
    }


async def count_workflow(client: Client, workflow_id: str) -> dict[str, Any]:
    """`count_history` of a closed workflow, plus the server's count of its state transitions."""
    handle = client.get_workflow_handle(workflow_id)
    counts = count_history(await handle.fetch_history())
    description = await handle.describe()
    counts["state_transitions"] = description.raw_description.workflow_execution_info.state_transition_count
    return counts


def rollout_input(policy_base: str, tool_turns: int, index: int) -> RolloutInput:
    task = bench_task(index, tool_turns=tool_turns)
    model = ModelConfig(base_url=endpoint(policy_base, 0.0))
    return RolloutInput(env=ENV_NAME, task=task, model=model, limits=RolloutLimits(max_turns=tool_turns + 1))


async def count_plans(
    client: Client,
    policy_base: str,
    *,
    tool_turns: int,
    task_queue: str,
    plans: list[tuple[str, dict[str, Any]]],
    id_prefix: str = "actions",
) -> dict[str, Any]:
    """One rollout per plan on `task_queue`; label -> counts (or why the plan was skipped)."""
    rows: dict[str, Any] = {}
    for index, (label, overrides) in enumerate(plans):
        plan = plan_input(rollout_input(policy_base, tool_turns, index), overrides)
        if plan is None:
            rows[label] = {"skipped": f"RolloutInput has no field among {sorted(overrides)} on this commit"}
            continue
        workflow_id = f"{id_prefix}-{label}-{index}"
        result = await sdk.run_rollout(client, plan, task_queue=task_queue, workflow_id=workflow_id)
        if result.reward is None or result.reward.total != 1.0 or result.tool_calls != tool_turns:
            raise RuntimeError(f"plan {label}: the rollout did not finish as expected: {result.termination}")
        rows[label] = {"overrides": overrides, **await count_workflow(client, workflow_id)}
    return rows


async def probe_heartbeats(client: Client, policy_base: str, delays: list[float]) -> dict[str, Any]:
    """State transitions a model turn's heartbeats add, per turn, at each model latency (1 tool turn, classic)."""
    rows: dict[str, Any] = {}
    for delay in [0.0, *delays]:
        plan = rollout_input(policy_base, 1, 0).model_copy(update={"fuse_turns": False})
        plan.model.base_url = endpoint(policy_base, delay)
        workflow_id = f"actions-probe-{delay:g}"
        await sdk.run_rollout(client, plan, task_queue=QUEUE, workflow_id=workflow_id)
        rows[f"{delay:g}"] = (await count_workflow(client, workflow_id))["state_transitions"]
    base = rows["0"]
    return {
        f"{d:g}": {"transitions_added_per_turn": (rows[f"{d:g}"] - base) / 2,
                   "heartbeats_per_turn_model": heartbeats_per_turn(d, Assumptions())}
        for d in delays
    }  # fmt: skip


async def run(tool_turns: int, probe: list[float]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gymflow-actions-"))
    procs = Procs()
    try:
        address = await start_server(procs, work / "server", extra_args=[])
        await start_worker(procs, "gymflow", mode="gymflow", address=address, task_queue=QUEUE)
        policy = await start_policy(procs)
        client = await connect(address)
        plans = await count_plans(client, policy, tool_turns=tool_turns, task_queue=QUEUE, plans=PLANS)
        report: dict[str, Any] = {"tool_turns": tool_turns, "load": load(), "plans": plans}
        if probe:
            report["heartbeat_probe"] = await probe_heartbeats(client, policy, probe)
        return report
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


COLUMNS = [
    ("activities", "activities"),
    ("workflow_tasks", "WFTs"),
    ("markers", "markers"),
    ("actions", "act+WFT+markers"),
    ("search_attribute_upserts", "SA upserts"),
    ("memo_upserts", "memo upserts"),
    ("state_transitions", "state transitions"),
    ("events", "events"),
    ("history_bytes", "history B"),
    ("billable_actions", "Cloud actions"),
]


def table(report: dict[str, Any]) -> str:
    """A markdown table, one row per plan."""
    lines = ["| plan | " + " | ".join(title for _, title in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for label, row in report["plans"].items():
        if "skipped" in row:
            lines.append(f"| {label} | skipped: {row['skipped']} |")
            continue
        lines.append(f"| {label} | " + " | ".join(f"{row[key]:,}" for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool-turns", type=int, default=4)
    parser.add_argument("--probe", type=float, nargs="*", default=[], help="model latencies (s) to probe heartbeats at")
    args = parser.parse_args()
    report = asyncio.run(run(args.tool_turns, args.probe))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "actions.json").write_text(json.dumps(report, indent=2))
    print(table(report))
    for label, row in report["plans"].items():
        if "skipped" not in row:
            print(label, json.dumps({k: row[k] for k in ("activities_by_type", "markers_by_name", "billable")}))
    if "heartbeat_probe" in report:
        print("heartbeats:", json.dumps(report["heartbeat_probe"]))
    print(f"wrote {OUT / 'actions.json'}")


if __name__ == "__main__":
    main()
