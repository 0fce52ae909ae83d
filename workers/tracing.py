"""Traces of rollouts: OpenTelemetry through the SDK's interceptor, exported over OTLP/HTTP.

On when an OTLP endpoint is configured (`GYMFLOW_OTLP_ENDPOINT`, else the standard
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`). Then
every Temporal client the process makes (the worker's, a command's) carries the SDK's
`OpenTelemetryInterceptor` (temporalio.contrib.opentelemetry) with its Temporal spans:
`StartWorkflow`, `RunWorkflow`, `StartActivity` / `RunActivity` for each model call, tool call
and reward, the trace context riding in Temporal headers from the process that schedules to the
one that runs (another node, another machine). The workflows add the rollout's own structure
(gymflow.workflows.spans): each rollout is a trace of its own, `rollout` -> `turn` -> the model
call and tool calls -> `reward`, linked to the trace of whoever started it (a batch, a command).

The process's global tracer provider is temporalio's replay-safe one (`create_tracer_provider`):
span ids in workflow code come from the workflow's deterministic random, and spans are not
emitted again while a history replays on another worker. Spans leave in batches
(`BatchSpanProcessor`); `flush()` sends what is left before a command exits.

The exporter and the SDK are optional dependencies (`pip install 'gymflow[otel]'`): without an
endpoint nothing here imports them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from temporalio.client import Interceptor

from gymflow.envs.errors import TracingUnavailable

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider

    from gymflow.workers.config import Settings

INSTALL = "pip install 'gymflow[otel]'"


class _State:
    provider: ReplaySafeTracerProvider | None = None
    exporting: dict[str, SpanProcessor] = {}
    """OTLP endpoints this process exports to, and their processors."""


def traces_endpoint(settings: Settings) -> str | None:
    """The OTLP/HTTP traces URL the settings (or the standard OTEL_* variables) name, if any."""
    if settings.otlp_endpoint:
        return settings.otlp_endpoint
    if endpoint := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return endpoint
    if base := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.rstrip("/") + "/v1/traces"
    return None


def tracer_provider(service_name: str = "gymflow") -> ReplaySafeTracerProvider:
    """The process's global, replay-safe tracer provider (made and installed on first use).

    Raises:
        TracingUnavailable: opentelemetry-sdk is not installed.
    """
    if _State.provider is None:
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.resources import Resource
            from temporalio.contrib.opentelemetry import create_tracer_provider
        except ImportError as exc:
            raise TracingUnavailable(f"tracing needs the OpenTelemetry SDK: {INSTALL} ({exc})") from None
        _State.provider = create_tracer_provider(resource=Resource.create({"service.name": service_name}))
        trace.set_tracer_provider(_State.provider)
    return _State.provider


def export(processor: SpanProcessor, *, service_name: str = "gymflow") -> None:
    """Send the process's spans to `processor` too (an OTLP batch exporter, a test's in-memory one)."""
    tracer_provider(service_name).add_span_processor(processor)


def interceptors() -> list[Interceptor]:
    """The SDK's OpenTelemetry interceptor with Temporal spans, for a client of a traced process.

    Raises:
        TracingUnavailable: opentelemetry-sdk is not installed.
    """
    tracer_provider()  # the interceptor's workflow half insists on the replay-safe provider
    from temporalio.contrib.opentelemetry import OpenTelemetryInterceptor

    return [OpenTelemetryInterceptor(add_temporal_spans=True)]


def client_interceptors(settings: Settings, *, service_name: str = "gymflow") -> list[Interceptor]:
    """The interceptors a client of this process gets: tracing when an OTLP endpoint is configured.

    Raises:
        TracingUnavailable: An endpoint is configured but the exporter is not installed.
    """
    endpoint = traces_endpoint(settings)
    if endpoint is None:
        return []
    if endpoint not in _State.exporting:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise TracingUnavailable(
                f"{endpoint}: exporting traces needs the OTLP exporter: {INSTALL} ({exc})"
            ) from None
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))
        export(processor, service_name=service_name)
        _State.exporting[endpoint] = processor
    return interceptors()


def flush(timeout_s: float = 5.0) -> None:
    """Send the spans still batched (before a command exits without interpreter teardown)."""
    if _State.provider is not None:
        _State.provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Send what is batched and stop exporting to the OTLP endpoints (a worker's exit)."""
    flush()
    for processor in _State.exporting.values():
        processor.shutdown()
    _State.exporting.clear()
