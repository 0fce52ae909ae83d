"""`gymflow inspect ROLLOUT_ID`: one rollout's trajectory for a terminal, read from its history.

Everything comes from the workflow's event history, decoded with the deployment's data converter
(encryption and external payload storage included), so it works for running rollouts too: each
activity is a step with its summary (``crm.search_accounts(name="Acme")``), when it started
relative to the rollout, how long it took (scheduled to closed, and attempts), and what it
returned — the model's reply and tool calls, the tool's result, the reward and its components.
The header has the outcome (reward, termination, error), the counts, and the Web UI link. Model
turns run as local activities appear from their markers, timed as the marker records them.
A parent workflow (batch, group, training run) gets its progress and result instead.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError, WorkflowQueryRejectedError
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities import names

PROGRESS_QUERY = "progress"
"""The query the gymflow workflows that run for a while answer (DESIGN: a `progress` query on every parent)."""
PROGRESS_TYPES = frozenset(
    {names.ROLLOUT_WORKFLOW, names.BATCH_WORKFLOW, names.DATASET_WORKFLOW, names.TRAINING_WORKFLOW,
     names.SESSION_WORKFLOW, names.RESCORE_WORKFLOW}
)  # fmt: skip
"""Workflow types that answer PROGRESS_QUERY; the others (a group: short-lived, its rollouts say it
all) are never asked, since a query they have no handler for only fails."""


@dataclass
class Step:
    """One activity of the rollout (or one local activity marker)."""

    index: int
    activity: str
    summary: str
    offset_s: float
    """Seconds from the workflow's start to the activity's scheduling."""
    duration_s: float | None = None
    """Scheduled to closed (retries included); None while it runs."""
    attempts: int = 0
    outcome: str = "running"
    """completed, failed, timed_out, cancelled or running."""
    input: Any = None
    result: Any = None
    error: str | None = None


@dataclass
class Inspection:
    """What `gymflow inspect` shows (also its --json output)."""

    workflow_id: str
    run_id: str
    workflow_type: str
    status: str
    ui: str
    started: str | None = None
    closed: str | None = None
    duration_s: float | None = None
    search_attributes: dict[str, Any] = field(default_factory=dict)
    input: Any = None
    result: Any = None
    failure: str | None = None
    progress: Any = None
    steps: list[Step] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _seconds(event: HistoryEvent, start: datetime) -> float:
    return (event.event_time.ToDatetime() - start).total_seconds()


async def _decode(client: Client, payloads: Payloads | None) -> Any:
    if payloads is None or not payloads.payloads:
        return None
    try:
        values = await client.data_converter.decode(list(payloads.payloads))
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:  # another key, a missing object, ...
        return f"<undecodable payload: {exc}>"
    return values[0] if len(values) == 1 else values


async def _text(client: Client, payload: Payload | None) -> str:
    if payload is None or not payload.ByteSize():
        return ""
    value = await _decode(client, Payloads(payloads=[payload]))
    return value if isinstance(value, str) else json.dumps(value)


def _failure_text(failure: Any) -> str:
    """A failure and its causes, `outer: inner`; a cause the message before it already quotes (an
    activity's error wrapping an env's InfraError) is said once."""
    parts: list[str] = []
    while failure is not None and failure.ByteSize():
        if failure.message and not (parts and failure.message in parts[-1]):
            parts.append(failure.message)
        failure = failure.cause if failure.HasField("cause") else None
    return ": ".join(parts)


def _turn(activity: str, input: Any) -> dict[str, Any] | None:
    """A fused turn's model input (`generate`), or None for any other step."""
    generate = input.get("generate") if activity == "play_turn" and isinstance(input, dict) else None
    return generate if isinstance(generate, dict) and isinstance(generate.get("turn"), int) else None


def _label(activity: str, turn: dict[str, Any] | None, model: str | None) -> str:
    """A step without a summary: fused turns carry none (gymflow.workflows.rollout), so name the turn from its
    input (`_turn`); `model`: the model its input or, for a turn sent as a delta, the last whole one named."""
    return activity if turn is None else f"{model or 'model'} turn {turn['turn'] + 1} + tools"


async def _steps(client: Client, events: list[HistoryEvent], start: datetime) -> list[Step]:
    steps: dict[int, Step] = {}
    model: str | None = None  # the model the last whole fused turn named
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            summary = await _text(client, event.user_metadata.summary if event.HasField("user_metadata") else None)
            input = await _decode(client, attrs.input)
            turn = _turn(attrs.activity_type.name, input)
            model = ((turn or {}).get("model") or {}).get("model") or model
            label = _label(attrs.activity_type.name, turn, model)
            steps[event.event_id] = Step(
                index=len(steps) + 1,
                activity=attrs.activity_type.name,
                summary=summary or label,
                offset_s=_seconds(event, start),
                input=input,
            )
            continue
        for name, outcome in (
            ("activity_task_started_event_attributes", "running"),
            ("activity_task_completed_event_attributes", "completed"),
            ("activity_task_failed_event_attributes", "failed"),
            ("activity_task_timed_out_event_attributes", "timed_out"),
            ("activity_task_canceled_event_attributes", "cancelled"),
        ):
            if not event.HasField(name):  # type: ignore[arg-type]
                continue
            attrs = getattr(event, name)
            step = steps.get(attrs.scheduled_event_id)
            if step is None:
                break
            if outcome == "running":
                step.attempts = attrs.attempt
                break
            step.outcome = outcome
            step.duration_s = _seconds(event, start) - step.offset_s
            if outcome == "completed":
                step.result = await _decode(client, attrs.result)
            elif hasattr(attrs, "failure"):
                step.error = _failure_text(attrs.failure)
            break
        if event.HasField("marker_recorded_event_attributes"):
            step = await _local_activity(client, event, start, len(steps) + 1)
            if step is not None:
                steps[event.event_id] = step
    return list(steps.values())


async def _local_activity(client: Client, event: HistoryEvent, start: datetime, index: int) -> Step | None:
    """A local activity (e.g. a model turn with `ModelConfig.local_activity`), from its marker."""
    attrs = event.marker_recorded_event_attributes
    if "local_activity" not in attrs.marker_name:
        return None
    data = await _decode(client, attrs.details["data"]) if "data" in attrs.details else None
    data = data if isinstance(data, dict) else {}
    done, scheduled = _marker_time(data.get("complete_time")), _marker_time(data.get("original_schedule_time"))
    duration = max(0.0, done - scheduled) if done is not None and scheduled is not None else None
    failed = attrs.HasField("failure") and attrs.failure.ByteSize()
    return Step(
        index=index,
        activity=str(data.get("activity_type", "local activity")),
        summary=f"{data.get('activity_type', 'local activity')} (local)",
        offset_s=_seconds(event, start)
        if done is None
        else max(0.0, done - (duration or 0.0) - start.replace(tzinfo=UTC).timestamp()),
        duration_s=duration,
        attempts=int(data.get("attempt", 1)),
        outcome="failed" if failed else "completed",
        result=None if failed else await _decode(client, attrs.details.get("result")),
        error=_failure_text(attrs.failure) if failed else None,
    )


def _marker_time(value: Any) -> float | None:
    """A protobuf Timestamp as the marker's JSON holds it, in epoch seconds."""
    if isinstance(value, dict) and isinstance(value.get("seconds"), int | float):
        return float(value["seconds"]) + float(value.get("nanos") or 0) / 1e9
    return None


async def inspect_workflow(client: Client, workflow_id: str, *, run_id: str | None, ui_url: str) -> Inspection:
    """Read a workflow's history and describe it (a rollout step by step, a parent by its progress).

    Raises:
        temporalio.service.RPCError: No such workflow (or the server is unreachable).
    """
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    description = await handle.describe()
    history = await handle.fetch_history()
    events = list(history.events)
    start = events[0].event_time.ToDatetime()
    status = description.status.name if description.status else "UNKNOWN"
    run = description.run_id
    inspection = Inspection(
        workflow_id=workflow_id,
        run_id=run,
        workflow_type=description.workflow_type,
        status=status,
        ui=f"{ui_url}/workflows/{quote(workflow_id, safe='')}/{run}/history",  # ids may hold '/'
        started=description.start_time.isoformat() if description.start_time else None,
        closed=description.close_time.isoformat() if description.close_time else None,
        search_attributes={
            pair.key.name: pair.value
            for pair in description.typed_search_attributes
            if pair.key.name.startswith("Gymflow")
        },
        input=await _decode(client, events[0].workflow_execution_started_event_attributes.input),
    )
    last = events[-1]
    inspection.duration_s = _seconds(last, start) if description.close_time else None
    if last.HasField("workflow_execution_completed_event_attributes"):
        inspection.result = await _decode(client, last.workflow_execution_completed_event_attributes.result)
    elif last.HasField("workflow_execution_failed_event_attributes"):
        inspection.failure = _failure_text(last.workflow_execution_failed_event_attributes.failure)
    if description.workflow_type == names.ROLLOUT_WORKFLOW:
        inspection.steps = await _steps(client, events, start)
    if description.status == WorkflowExecutionStatus.RUNNING and description.workflow_type in PROGRESS_TYPES:
        inspection.progress = await query_progress(client, workflow_id, run_id=run)
    return inspection


async def query_progress(client: Client, workflow_id: str, *, run_id: str | None = None, timeout_s: float = 5.0) -> Any:
    """The workflow's `progress` query (ask only PROGRESS_TYPES), or a sentence saying why there is none."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        return await handle.query(PROGRESS_QUERY, rpc_timeout=timedelta(seconds=timeout_s))
    except RPCError as exc:
        if exc.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):  # the rpc_timeout
            return f"unavailable: no worker answered within {timeout_s:g} s (is a worker polling its task queue?)"
        return f"unavailable: {exc.message[:160]}"
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as exc:
        return f"unavailable: {str(exc)[:160]}"


# -- rendering -------------------------------------------------------------------------------
def _cut(text: str, width: int | None) -> str:
    text = text.replace("\n", " ⏎ ")
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _describe_result(step: Step, width: int | None) -> str:
    value = step.result
    if step.error:
        return f"ERROR {step.error}"
    if not isinstance(value, dict):
        return "" if value is None else _cut(json.dumps(value), width)
    if step.activity == "generate":
        return _reply(value, width)
    if step.activity == "play_turn":  # a fused turn: the reply, each call's result, a final answer's reward
        lines = [_reply(value.get("generated") or {}, width)]
        calls = ((value.get("generated") or {}).get("message") or {}).get("tool_calls", [])
        for call, result in zip(calls, value.get("results") or [], strict=False):
            flag = "ERROR " if result.get("is_error") else ""
            lines.append(_cut(f"{call.get('name')} → {flag}{result.get('text', '')}", width))
        if value.get("reward"):
            lines.append(_describe_result(Step(0, "compute_reward", "", 0.0, result=value["reward"]), width))
        return "\n".join(line for line in lines if line)
    if step.activity == "call_tool":
        flag = "ERROR " if value.get("is_error") else ""
        return flag + _cut(str(value.get("text", "")), width)
    if step.activity == "compute_reward":
        parts = ", ".join(f"{k}={v:g}" for k, v in (value.get("components") or {}).items())
        return f"reward {value.get('total')}" + (f" ({parts})" if parts else "")
    if step.activity == "init_rollout":
        return f"{len(value.get('tools', []))} tools on {value.get('node_queue', '?')}"
    if step.activity == "model_call":  # a harness program's model call (gymflow.workflows.harness)
        choice = ((value.get("completion") or {}).get("choices") or [{}])[0]
        message = choice.get("message") or {}
        calls = [c.get("function") or {} for c in message.get("tool_calls") or []]
        text = message.get("content") or ""
        made = ", ".join(f"{c.get('name')}({c.get('arguments')})" for c in calls)
        return _cut((f"says {text!r}" if text else "") + (f" calls {made}" if made else ""), width)
    if step.activity == "run_program":
        tail = str(value.get("output") or "").strip().splitlines()[-1:] or [""]
        return _cut(f"exit {value.get('exit_code')} after {value.get('duration_s', 0):.1f}s: {tail[0]}", width)
    return _cut(json.dumps(value), width)


def _reply(result: dict[str, Any], width: int | None) -> str:
    """A model turn's reply: what it says and the calls it makes."""
    message = result.get("message") or {}
    calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments'))})" for c in message.get("tool_calls", []))
    reply = message.get("content") or ""
    return _cut((f"says {reply!r}" if reply else "") + (f" calls {calls}" if calls else ""), width)


def _outcome(result: dict[str, Any]) -> str:
    reward = result.get("reward")
    total = "infra-failed (no reward)" if reward is None else f"reward {reward.get('total'):.3f}"
    components = ", ".join(f"{k} {v:g}" for k, v in ((reward or {}).get("components") or {}).items())
    line = f"{total}{f' ({components})' if components else ''} · {result.get('termination')}"
    line += (
        f" · {result.get('turns')} turns, {result.get('tool_calls')} tool calls, {result.get('recoveries')} recoveries"
    )
    return line + (f"\nerror: {result['error']}" if result.get("error") else "")


def render(inspection: Inspection, *, width: int | None = 160) -> str:
    """The terminal view of an inspection."""
    i = inspection
    took = f" in {i.duration_s:.2f} s" if i.duration_s is not None else ""
    lines = [f"{i.workflow_type} {i.workflow_id} — {i.status}{took}", f"UI: {i.ui}"]
    sa = i.search_attributes
    if sa:
        lines.append(" · ".join(f"{k.removeprefix('Gymflow').lower()} {v}" for k, v in sorted(sa.items())))
    if isinstance(i.result, dict) and "termination" in i.result:
        lines.append(_outcome(i.result))
        reward = i.result.get("reward") or {}
        if reward.get("info"):
            lines.append(f"reward info: {_cut(json.dumps(reward['info']), width)}")
    elif i.result is not None:
        lines.append(f"result: {_cut(json.dumps(i.result), width)}")
    if i.failure:
        lines.append(f"failed: {i.failure}")
    if i.progress is not None:
        lines.append(f"progress: {json.dumps(i.progress) if not isinstance(i.progress, str) else i.progress}")
    task = (i.input or {}).get("task") if isinstance(i.input, dict) else None
    if isinstance(task, dict):
        prompt = task.get("prompt")
        lines.append(f"task {task.get('id')}: {_cut(prompt if isinstance(prompt, str) else json.dumps(prompt), width)}")
    if i.steps:
        lines += ["", f"{'#':>3} {'at':>8} {'took':>8} {'try':>3}  step"]
        for step in i.steps:
            at = f"{step.offset_s:.2f}s"
            dur = "…" if step.duration_s is None else f"{step.duration_s:.2f}s"
            lines.append(f"{step.index:>3} {at:>8} {dur:>8} {step.attempts:>3}  {step.summary}")
            lines += [f"{'':>26}→ {detail}" for detail in _describe_result(step, width).split("\n") if detail]
    if isinstance(i.result, dict) and i.result.get("messages"):
        final = i.result["messages"][-1]
        if final.get("role") == "assistant":
            lines += ["", f"final answer: {_cut(final.get('content', ''), width)}"]
    return "\n".join(lines)
