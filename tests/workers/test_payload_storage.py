"""Payloads past Temporal's 2 MB limit go to S3 through temporalio's ExternalStorage (S3 driver over
boto3, moto's server mode as a real S3 HTTP API): a 5 MB tool output and a 10 MB trajectory."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import figures
import pytest
from leaks import payloads_in
from moto.server import ThreadedMotoServer
from temporalio.client import Client

from gymflow.activities.env import TOOL_RESULT_SHARE
from gymflow.activities.schema import RetrySettings, RolloutLimits
from gymflow.envs.contract import Message, Task, TerminationReason
from gymflow.workers.client import connect, data_converter
from gymflow.workers.worker import running_worker
from support import ScriptedPolicy, call, make_settings, play

BLOB = 5_000_000
"""Characters of one tool output: 2.5x Temporal's per-payload limit."""
SERVER_LIMIT = 2 * 1024 * 1024


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(endpoint, bucket) of a fresh bucket on moto's S3 server."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint, bucket = f"http://{host}:{port}", f"payloads-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield endpoint, bucket
    server.stop()


async def test_huge_tool_output_and_trajectory_round_trip_through_s3(
    temporal_address: str, tmp_path: Path, s3: tuple[str, str]
) -> None:
    endpoint, bucket = s3
    settings = make_settings(tmp_path, payload_storage_uri=f"s3://{bucket}/gymflow/payloads", s3_endpoint_url=endpoint)
    client: Client = await connect(temporal_address, data_converter=data_converter(settings))
    script = ScriptedPolicy(
        [
            Message(role="assistant", tool_calls=[call("blob", {"size": BLOB})]),
            Message(role="assistant", tool_calls=[call("blob", {"size": BLOB})]),
            Message(role="assistant", content="0"),
        ]
    )
    task = Task(id="big", prompt="read two big blobs", ground_truth="0")
    # The activity-level output policy would cut 5 MB to 16,000 characters: raise it for this test.
    limits = RolloutLimits(max_tool_output_chars=6_000_000, tool_timeout_s=60)
    started = time.monotonic()
    async with running_worker(client, settings) as worker:
        result = await play(client, worker, script, env="counter", task=task, limits=limits)
    elapsed = time.monotonic() - started
    assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed, result.error
    outputs = [m.content for m in result.messages if m.role == "tool"]
    assert [len(o) for o in outputs] == [BLOB, BLOB] and all(set(o) == {"x"} for o in outputs)
    assert result.reward is not None and result.reward.total == 1.0
    trajectory_bytes = len(result.model_dump_json())
    assert trajectory_bytes > 10_000_000

    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    references = [p for e in history.events for p in payloads_in(e) if p.external_payloads]
    stored = sum(p.external_payloads[0].size_bytes for p in references)
    # Both tool results, the model turns that carried them, and the 10 MB result went to S3 ...
    assert len(references) >= 4 and max(p.external_payloads[0].size_bytes for p in references) > 10_000_000
    # ... and nothing near the limit stayed inline.
    assert max(e.ByteSize() for e in history.events) < SERVER_LIMIT // 4
    objects = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").list_objects_v2(
        Bucket=bucket, Prefix="gymflow/payloads/v0/"
    )
    assert objects["KeyCount"] >= 3
    figures.record(
        "payloads", "5 MB tool outputs, 10 MB trajectory via S3",
        tool_output_bytes=BLOB, trajectory_bytes=trajectory_bytes, external_payloads=len(references),
        external_bytes=stored, largest_history_event_bytes=max(e.ByteSize() for e in history.events),
        seconds=round(elapsed, 1),
    )  # fmt: skip


async def test_without_external_storage_the_same_output_is_cut_with_a_note(client: Client, tmp_path: Path) -> None:
    """The control: without S3 the 5 MB output is cut to a share of the payload limit, with a note
    the model reads, and the rollout goes on (never an env_error worded by the SDK)."""
    script = ScriptedPolicy(
        [Message(role="assistant", tool_calls=[call("blob", {"size": BLOB})]), Message(role="assistant", content="0")]
    )
    settings = make_settings(tmp_path)
    async with running_worker(client, settings) as worker:
        result = await play(
            client, worker, script, env="counter", task=Task(id="big", prompt="p", ground_truth="0"),
            limits=RolloutLimits(max_tool_output_chars=6_000_000), retry=RetrySettings(env_attempts=1),
        )  # fmt: skip
    assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed, result.error
    assert result.reward is not None and result.reward.total == 1.0
    [output] = [m.content for m in result.messages if m.role == "tool"]
    budget = SERVER_LIMIT // TOOL_RESULT_SHARE
    assert len(output.encode()) <= budget and output.startswith("xxxx")
    assert output.endswith("; dropped its structured content; text cut to fit]")
    assert f"over the {budget}-byte share of the payload limit" in output and "characters truncated" in output
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    assert max(e.ByteSize() for e in history.events) < SERVER_LIMIT
    figures.record(
        "payloads", "5 MB tool output without external storage",
        tool_output_chars=BLOB, kept_chars=output.count("x"), kept_bytes=len(output.encode()), budget_bytes=budget,
    )  # fmt: skip
