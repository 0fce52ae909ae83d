"""The model path of dataset generation against a scripted OpenAI-compatible server (real HTTP):
good, bad, garbage and hanging replies from the generator and the judge are counted rejections
with their own reasons, and no call that completed is ever made again."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pytest
from dataset_support import ScriptedModel, ScriptedServer, by_share
from temporalio.client import Client

from gymflow.activities.dataset_models import DatasetSource, GenerationOptions
from gymflow.activities.model import ModelConfig
from gymflow.activities.names import dataset_queue
from gymflow.activities.schema import DatasetInput, DatasetResult
from gymflow.envs.datagen import format as fmt
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.dataset import DatasetGenerationWorkflow

SAMPLE = Path(__file__).parents[2] / "envs" / "builtin" / "search" / "sample_corpus"


def recorded_calls(out: Path) -> dict[str, float]:
    """Call-store file -> when its reply was stored."""
    return {p.name: json.loads(p.read_bytes())["stored_at"] for p in out.glob("work/*/calls/*.json")}


@pytest.mark.slow  # waits out model timeouts
async def test_model_path_good_bad_garbage_and_timeouts(client: Client, worker: RunningWorker, tmp_path: Path) -> None:
    scripted = ScriptedModel(
        decide=by_share(good=0.6, bad=0.15, garbage=0.15, hang=0.1),
        judge_decide=by_share(good=0.7, garbage=0.15, hang=0.15),
        hang_s=20,
    )
    out = tmp_path / "ds"
    async with ScriptedServer(scripted) as server:
        result: DatasetResult = await client.execute_workflow(
            DatasetGenerationWorkflow.run,
            DatasetInput(
                source=DatasetSource(kind="corpus", location=str(SAMPLE)),
                n=25,
                out=str(out),
                batch_size=24,
                window=2,
                options=GenerationOptions(
                    generator="model",
                    model=ModelConfig(base_url=server.url, request_timeout_s=1),
                    judge=ModelConfig(base_url=server.url, request_timeout_s=1, temperature=0),
                    types=["extractive", "multi_hop"],
                    too_easy=False,
                    call_attempts=2,
                    heartbeat_s=10,
                ),
            ),
            id=f"ds-model-{uuid.uuid4().hex[:8]}",
            task_queue=dataset_queue(worker.task_queue),
        )
    assert result.accepted == 25 and result.target_met
    reasons = result.rejections
    # Each kind of failure has its own reason; a failed judge call is never read as "not grounded".
    assert reasons.get("generate/unparseable_reply", 0) > 0, reasons
    assert reasons.get("guard/refers_to_text", 0) > 0, reasons
    assert reasons.get("generate/model_error", 0) > 0, reasons
    assert reasons.get("judge/judge_unparseable", 0) > 0, reasons
    assert reasons.get("judge/judge_error", 0) > 0, reasons
    hung = Counter(e["key"] for e in scripted.log if e["outcome"] == "hang")
    assert hung and max(hung.values()) <= 2  # call_attempts=2, then a rejection (or the batch was cancelled)
    # No completed call made again: every key answered once, and asked again only while unanswered.
    answered = Counter(e["key"] for e in scripted.log if e["answered"] is not None)
    assert answered and max(answered.values()) == 1
    rows = fmt.tasks_from_jsonl((out / "train.jsonl").read_bytes()) + fmt.tasks_from_jsonl(
        (out / "eval.jsonl").read_bytes()
    )
    assert len(rows) == 25 and all(r.metadata["generator"] == "scripted" for r in rows)
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert Counter(f"{r['stage']}/{r['reason']}" for r in rejected) == Counter(reasons)
