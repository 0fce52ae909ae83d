"""The report boundary: a finished batch's trajectories, read from storage, become its report.

`render_batch_report` reads the batch's JSONL parts, computes the report (gymflow.envs.eval.report: the same
numbers `gymflow eval` shows) and writes ``report.html`` (self-contained, inline SVG plots) and
``report.json`` beside the parts, under ``<batch id>/``. `BatchRolloutWorkflow` runs it when it
ends, so every batch has a report however it was started (CLI, SDK, ``temporal workflow start``),
and its `BatchResult.report` holds the page's URI.

The rendering is CPU work (bootstrap resampling): it runs in a thread, so the worker's event
loop keeps serving other activities. The worker's Web UI base URL (`Settings.ui_url`) makes the
links; workers of one deployment should agree on it.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from gymflow.activities import errors
from gymflow.activities.storage import StorageActivities, read_trajectories
from gymflow.envs.contract import Wire
from gymflow.envs.errors import StorageError
from gymflow.envs.eval import stats
from gymflow.envs.eval.html import render_report
from gymflow.envs.eval.report import BatchRef

REPORT_HTML = "report.html"
REPORT_JSON = "report.json"


class BatchReportInput(Wire):
    batch_id: str
    env: str
    parts: list[str]
    """URIs of the batch's JSONL parts."""
    destination: str | None = None
    """Base URI the parts went to (None: the worker's default store); the report goes there too."""
    label: str = "policy"
    """What ran (a policy's name, a model), shown as the report's title."""
    reps: int = Field(default=2000, ge=10, le=100_000)
    """Bootstrap replicates per interval."""
    lineage: str | None = None
    """How the batch came to be, when not by running all of its rollouts (`BatchRef.lineage`)."""
    rollout_batches: list[str] = Field(default_factory=list)
    """The batches whose rollout workflows its trajectories are, when not it alone (`BatchRef.rollout_batches`)."""


class BatchReportResult(Wire):
    html_uri: str
    json_uri: str
    rollouts: int


def ui_query_url(ui_base: str, query: str) -> str:
    """The Web UI's list of workflows matching a visibility query."""
    return f"{ui_base}/workflows?query={quote(query)}"


class ReportActivities:
    """Renders reports of batches; owns nothing but its storage settings and the Web UI URL."""

    def __init__(self, storage: StorageActivities, *, ui_base: str | None) -> None:
        self.storage = storage
        self.ui_base = ui_base

    @activity.defn(name="render_batch_report")
    async def render_batch_report(self, input: BatchReportInput) -> BatchReportResult:
        """Read the batch's trajectories, write report.html and report.json beside them, return their URIs."""
        try:
            trajectories = await read_trajectories(input.parts, s3_endpoint_url=self.storage.s3_endpoint_url)
        except StorageError as exc:
            raise errors.non_retryable(f"cannot read batch {input.batch_id}: {exc}", type=errors.STORAGE_ERROR) from exc
        if not trajectories:
            raise errors.non_retryable(
                f"batch {input.batch_id} has no trajectories to report", type=errors.STORAGE_ERROR
            )
        ui = ui_query_url(self.ui_base, f'GymflowBatch="{input.batch_id}"') if self.ui_base else None
        batch = BatchRef(
            role="policy",
            batch_id=input.batch_id,
            label=input.label,
            ui=ui,
            lineage=input.lineage,
            rollout_batches=input.rollout_batches,
        )
        _, page, data = await asyncio.to_thread(
            render_report,
            trajectories,
            boot=stats.Bootstrap(reps=input.reps),
            labels=(input.label, "baseline"),
            batches=[batch],
            ui_base=self.ui_base,
        )
        store = self.storage.store(input.destination)
        try:
            html_uri = await store.put(f"{input.batch_id}/{REPORT_HTML}", page.encode())
            json_uri = await store.put(f"{input.batch_id}/{REPORT_JSON}", data.encode())
        except StorageError as exc:
            raise errors.non_retryable(str(exc), type=errors.STORAGE_ERROR) from exc
        except Exception as exc:  # network, permissions, throttling: let Temporal retry it
            raise ApplicationError(
                f"writing the report of {input.batch_id} failed: {exc}", type=errors.STORAGE_ERROR
            ) from exc
        return BatchReportResult(html_uri=html_uri, json_uri=json_uri, rollouts=len(trajectories))
