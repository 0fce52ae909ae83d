"""A rollout's own spans, opened in workflow code: `rollout` -> `turn` -> (model call, tool calls) -> `reward`.

The SDK's OpenTelemetry interceptor (gymflow.workers.tracing) traces what Temporal sees: the
workflow run, and each activity scheduled and run (`StartActivity:generate` ->
`RunActivity:generate`, likewise `call_tool`, `compute_reward`, `play_turn`). These spans give
that the rollout's shape: `rollout` starts a trace of its own (one trace per rollout, linked to the
trace of whoever started it: a batch, a group, a command), each model turn is a `turn` span with
its model call and tool calls inside, and the reward a `reward` span.

They exist only on a worker that traces: its interceptor has opened the workflow's span (so a
span context is current) and the process's tracer provider is temporalio's replay-safe one, which
derives span ids from the workflow's deterministic random and emits nothing while a history
replays. Anywhere else each is a no-op context. A span adds no command: histories are the same
with tracing on or off. Workflow code only: no I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    try:
        from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider
    except ImportError:  # no opentelemetry-sdk: nothing traces
        ReplaySafeTracerProvider = None  # type: ignore[assignment,misc]

TRACER = "gymflow.workflows"


def _tracer() -> trace.Tracer | None:
    provider = trace.get_tracer_provider()
    if ReplaySafeTracerProvider is None or not isinstance(provider, ReplaySafeTracerProvider):
        return None
    if not trace.get_current_span().get_span_context().is_valid:  # this worker's interceptor does not trace
        return None
    return provider.get_tracer(TRACER)


@contextlib.contextmanager
def rollout(env: str, task_id: str, rollout_id: str) -> Iterator[None]:
    """The root span of a rollout's own trace, linked to the span that ran the workflow."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    started_by = trace.get_current_span().get_span_context()
    attributes = {"gymflow.env": env, "gymflow.task_id": task_id, "gymflow.rollout_id": rollout_id}
    with tracer.start_as_current_span(
        "rollout", context=otel_context.Context(), links=[trace.Link(started_by)], attributes=attributes
    ):
        yield


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A child span of the current one (`turn`, `reward`), when the workflow is traced."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    with tracer.start_as_current_span(name, attributes={f"gymflow.{k}": v for k, v in attributes.items()}):
        yield
