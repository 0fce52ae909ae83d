"""Rescoring a finished batch with another reward: `gymflow eval rescore BATCH --reward SPEC` and `rescore_batch`.

The work is a `RescoreBatchWorkflow` (gymflow.workflows.rescore): durable, in the Web UI like any
batch, with its own id, JSONL parts and report, and lineage to its source (`rescored_from`, the
reward). No model is called. Before anything starts, what the user can get wrong is checked here:
the reward must load and score from a stored trajectory alone (gymflow.envs.rescore), the batch must
exist, have completed and still have its parts in storage. Each refusal is a `UserError` (the CLI's
one line and exit 2), and the source batch is never written to.

At the end the new batch's trajectories are read back and the same report as `gymflow eval`'s is
written (by default under ``<data dir>/evals/<new batch id>``), naming the source and the reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from temporalio.common import TypedSearchAttributes

from gymflow.activities import names
from gymflow.activities.batches import find_batch
from gymflow.activities.rescore import RescoreInput, check_parts
from gymflow.activities.schema import BatchResult
from gymflow.activities.storage import read_trajectories
from gymflow.envs.eval.report import BatchRef
from gymflow.envs.rescore import OfflineReward, RewardSpec, absolute, describe, parse_reward_spec
from gymflow.workers.config import Settings
from gymflow.workers.roles import COMMAND_ROLES
from gymflow.workers.sdk import scripts
from gymflow.workers.sdk.evals import format_summary
from gymflow.workers.sdk.local import connect_or_start
from gymflow.workers.sdk.progress import Progress, follow
from gymflow.workers.sdk.report import write_report
from gymflow.workers.worker import running_worker
from gymflow.workflows.rescore import RescoreBatchWorkflow


@dataclass
class RescoreOptions:
    """What `gymflow eval rescore` runs."""

    batch: str
    """The finished batch whose stored trajectories are scored again."""
    reward: str | RewardSpec
    """As `--reward` takes it (`file.py:fn`, `module:fn`, `{fn: ..., extract: ...}` as YAML, an env
    name), or a parsed spec; relative paths are taken from the current directory."""
    label: str | None = None
    """The report's title; None: the source's label, rescored."""
    out: Path | None = None
    """Report directory; None: ``<data dir>/evals/<new batch id>``."""
    local_worker: bool = True
    reps: int = 2000
    seed: int = 0


def reward_spec(reward: str | RewardSpec) -> RewardSpec:
    """The spec of `reward`, its relative paths made absolute (a worker elsewhere loads it)."""
    if isinstance(reward, str):
        return parse_reward_spec(reward, base_dir=Path.cwd())
    return absolute(reward, Path.cwd())


async def rescore_batch(
    options: RescoreOptions, settings: Settings, *, out: TextIO = sys.stderr, announce: bool = True
) -> dict[str, Any]:
    """Rescore the batch as a new batch; returns the report summary with `batch_id`, `rescored_from`, `reward`.

    Raises:
        gymflow.envs.errors.RewardSpecError: The reward does not load (`LiveRewardError`: it needs
            the live rollout).
        gymflow.envs.errors.BatchError: The batch is unknown, unfinished, or its storage is gone.
    """
    spec = reward_spec(options.reward)
    OfflineReward.load(spec)  # refused here, before anything starts
    client = await connect_or_start(settings, start_server=False, out=out)
    found = await find_batch(client, options.batch, completed=True)
    await check_parts(found, s3_endpoint_url=settings.s3_endpoint_url)
    source: BatchResult | None = found.result
    if options.local_worker:
        settings = settings.command_queue("rescore")
        scripts.note_queue_on_interrupt(settings.task_queue)
    batch_id = f"{options.batch}-rescored-{uuid.uuid4().hex[:8]}"
    text = describe(spec)
    ui = settings.ui_url
    link = f"{ui}/workflows?query=" + quote(f'GymflowBatch="{batch_id}"')
    async with contextlib.AsyncExitStack() as stack:
        if options.local_worker:
            await stack.enter_async_context(running_worker(client, settings, roles=COMMAND_ROLES["eval"]))
        model = found.input.options.model.model or "default"
        handle = await client.start_workflow(
            RescoreBatchWorkflow.run,
            RescoreInput(source=options.batch, reward=spec, label=options.label),
            id=batch_id,
            task_queue=settings.task_queue,
            search_attributes=TypedSearchAttributes(
                names.start_attributes(found.input.env, model=model, batch=batch_id)
            ),
            memo={"rescored_from": options.batch, "reward": text},
            static_summary=f"{options.batch} rescored with {text}",
        )
        if announce:  # off under `--json`: stderr holds log lines and progress only
            print(f"rescoring batch {options.batch} with {text} as batch {batch_id}: {link}", file=out)
        progress = Progress(out, source.total if source else 0)
        finished = asyncio.Event()

        async def done() -> tuple[int, str]:
            return int((await handle.query(RescoreBatchWorkflow.progress))["completed"] or 0), "trajectories"

        bar = asyncio.create_task(follow(progress, done, finished))
        try:
            result = await handle.result()
        finally:
            finished.set()
            await bar
        progress.close(result.total, "trajectories")
    trajectories = await read_trajectories(result.parts, s3_endpoint_url=settings.s3_endpoint_url)
    label = options.label or f"{found.input.label or model} rescored"
    lineage = f"rescored from {options.batch} with reward {result.reward}"
    out_dir = options.out or settings.data_dir / "evals" / batch_id
    batch = BatchRef(role="policy", batch_id=batch_id, label=label, ui=link, report=result.report, lineage=lineage,
                     rollout_batches=[options.batch])  # fmt: skip
    report = write_report(
        trajectories, out_dir, reps=options.reps, seed=options.seed, labels=(label, "baseline"), batches=[batch],
        ui_base=ui,
    )  # fmt: skip
    summary = report.model_dump(mode="json")
    summary |= {
        "out_dir": str(out_dir),
        "report": str(out_dir / "report.html"),
        "batch_id": batch_id,
        "rescored_from": options.batch,
        "reward": result.reward,
        "result": result.model_dump(mode="json"),
    }
    return summary


def format_rescore(summary: dict[str, Any]) -> str:
    """A few lines for a terminal: the lineage, then what `gymflow eval` prints."""
    head = f"batch {summary['batch_id']}: {summary['rescored_from']} rescored with {summary['reward']}"
    return head + "\n" + format_summary(summary)
