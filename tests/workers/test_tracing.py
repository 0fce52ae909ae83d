"""Rollout traces through the SDK's OpenTelemetry interceptor: one trace per rollout, nested
rollout -> turn -> model call / tool call, and the reward; exported over real OTLP/HTTP too.

The first test collects spans with the SDK's in-memory exporter from a real worker running a
BatchRolloutWorkflow (children started by a workflow, not by the client), classic turns so model
calls and tool calls are activities of their own. The second runs a worker whose tracing is
configured as a deployment's is (an OTLP endpoint in its settings) against an OTLP/HTTP receiver
this test serves, and decodes the protobuf requests it gets.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from mcp_support import wait_until
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, BatchResult, RolloutInput, RolloutOptions
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.workers import tracing
from gymflow.workers.client import connect
from gymflow.workers.servers.policy import AppServer
from gymflow.workers.worker import running_worker
from gymflow.workflows.group import BatchRolloutWorkflow
from support import make_settings

ROLLOUTS = 4


def children(spans: Sequence[ReadableSpan]) -> dict[int, list[ReadableSpan]]:
    by_parent: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in spans:
        if span.parent is not None:
            by_parent[span.parent.span_id].append(span)
    return by_parent


def below(span: ReadableSpan, tree: dict[int, list[ReadableSpan]]) -> list[str]:
    """Names of every span under `span`."""
    found = []
    for child in tree.get(span.context.span_id, []):
        found += [child.name, *below(child, tree)]
    return found


@pytest.fixture
def exporter() -> AsyncIterator[InMemorySpanExporter]:
    collected = InMemorySpanExporter()
    processor = SimpleSpanProcessor(collected)
    tracing.export(processor)
    yield collected
    processor.shutdown()  # the process's provider stays; nothing is collected after this test


async def test_a_batch_yields_one_nested_trace_per_rollout(
    exporter: InMemorySpanExporter, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    client = await connect(temporal_address, interceptors=tracing.interceptors())
    settings = make_settings(tmp_path)
    tasks = generate_tasks(ROLLOUTS, seed=8)
    async with running_worker(client, settings):
        result: BatchResult = await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env="math",
                tasks=tasks,
                window=ROLLOUTS,
                destination=(tmp_path / "results").as_uri(),
                options=RolloutOptions(model=ModelConfig(base_url=calculator_policy_url), fuse_turns=False),
            ),
            id=f"traced-batch-{uuid.uuid4().hex[:8]}",
            task_queue=settings.task_queue,
        )
        assert result.total == ROLLOUTS

        def rollouts_ended() -> bool:
            return sum(s.name == "rollout" for s in exporter.get_finished_spans()) == ROLLOUTS

        await wait_until(rollouts_ended, timeout_s=30, what="every rollout span to end")
    spans = exporter.get_finished_spans()
    tree = children(spans)
    roots = [s for s in spans if s.name == "rollout"]
    assert len({r.context.trace_id for r in roots}) == ROLLOUTS  # one trace per rollout
    batch_trace = next(s for s in spans if s.name == "RunWorkflow:BatchRolloutWorkflow").context.trace_id
    assert batch_trace not in {r.context.trace_id for r in roots}
    for root in roots:
        assert root.parent is None and root.attributes and root.attributes["gymflow.env"] == "math"
        started_by = [link.context for link in root.links]
        assert started_by and started_by[0].trace_id == batch_trace  # linked to the batch that started it
        in_trace = [s for s in spans if s.context.trace_id == root.context.trace_id]
        assert all(s is root or s.parent is not None for s in in_trace)
        turns = [s for s in tree[root.context.span_id] if s.name == "turn"]
        assert len(turns) >= 2, [s.name for s in tree[root.context.span_id]]  # a tool turn, then the answer
        for turn in turns:
            inside = below(turn, tree)
            assert "RunActivity:generate" in inside, inside  # the model call, in the turn
        assert any("RunActivity:call_tool" in below(t, tree) for t in turns)  # the tool calls, in their turns
        [reward] = [s for s in tree[root.context.span_id] if s.name == "reward"]
        assert "RunActivity:compute_reward" in below(reward, tree)
        assert reward.start_time is not None and turns[-1].end_time is not None
        assert reward.start_time >= turns[-1].end_time  # spans carry real durations, in order


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint (POST /v1/traces, protobuf), keeping what it is sent."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

        async def traces(request: Request) -> Response:
            message = ExportTraceServiceRequest()
            message.ParseFromString(await request.body())
            self.requests.append(message)
            return Response(b"", media_type="application/x-protobuf")

        self.app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])

    def span_names(self) -> list[str]:
        return [
            span.name
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


async def test_a_configured_worker_exports_rollout_traces_over_otlp_http(
    temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    receiver = OtlpReceiver()
    async with AppServer(receiver.app) as server:
        endpoint = f"{server.url}/traces"  # url ends in /v1
        settings = make_settings(tmp_path, otlp_endpoint=endpoint)
        client = await connect(temporal_address, interceptors=tracing.client_interceptors(settings))
        try:
            async with running_worker(client, settings):
                await client.execute_workflow(
                    "RolloutWorkflow",
                    RolloutInput(
                        env="math", task=generate_tasks(1, seed=9)[0], model=ModelConfig(base_url=calculator_policy_url)
                    ),
                    id=f"otlp-{uuid.uuid4().hex[:8]}",
                    task_queue=settings.task_queue,
                )
        finally:
            await asyncio.to_thread(tracing.shutdown)  # flush, and stop exporting to this endpoint
    names = receiver.span_names()
    assert {"rollout", "turn", "reward", "RunWorkflow:RolloutWorkflow"} <= set(names), sorted(set(names))
    assert any(n.startswith("RunActivity:") for n in names)
