"""A retried generation batch asks the model only what it had not been answered yet."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dataset_support import ScriptedModel, ScriptedServer
from temporalio.testing import ActivityEnvironment

from gymflow.activities.dataset import DatasetActivities
from gymflow.activities.dataset_models import BatchInput, DatasetSource, GenerationOptions, ScanInput
from gymflow.activities.model import ModelConfig

SAMPLE = Path(__file__).parents[2] / "envs" / "builtin" / "search" / "sample_corpus"


def environment(attempt: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    return env


async def test_a_retried_batch_reuses_every_recorded_reply(tmp_path: Path) -> None:
    scripted = ScriptedModel()
    async with ScriptedServer(scripted) as server:
        options = GenerationOptions(
            generator="model",
            model=ModelConfig(base_url=server.url),
            judge=ModelConfig(base_url=server.url, temperature=0),
            too_easy=False,
        )
        activities = DatasetActivities(default_uri=tmp_path.as_uri())
        try:
            scan = await environment(1).run(
                activities.scan_dataset_source,
                ScanInput(workflow_id="w1", source=DatasetSource(kind="corpus", location=str(SAMPLE)),
                          out=str(tmp_path / "ds"), seed=0, n=10, options=options),
            )  # fmt: skip
            batch = BatchInput(
                workflow_id="w1", out=scan.out, kind="corpus", index=0, offset=0, limit=12,
                plan_uri=scan.plan_uri, chunks_uri=scan.chunks_uri, options=options,
            )  # fmt: skip
            first = await environment(1).run(activities.generate_dataset_batch, batch)
            asked = len(scripted.log)
            again = await environment(2).run(activities.generate_dataset_batch, batch)
        finally:
            await activities.aclose()
    assert first.calls_made == asked > 12 and first.calls_reused == 0
    assert again.calls_made == 0 and again.calls_reused == asked and len(scripted.log) == asked
    assert (Path(again.uri.removeprefix("file://"))).read_bytes() == (
        Path(first.uri.removeprefix("file://"))
    ).read_bytes()
