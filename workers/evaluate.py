"""`gymflow eval`: a policy (and optionally a baseline) on an env's dataset, with honest statistics.

Each policy runs as one BatchRolloutWorkflow (durable, windowed, results in storage). A policy
is an OpenAI-compatible URL or the name of one of the env's built-in baseline policies, which is
then served locally over real HTTP. While batches run, a progress bar reads the batches' progress
query; at the end the trajectories are read back from storage and `workers.report` writes
report.json, report.md and plots with bootstrap confidence intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from temporalio.client import Client, WorkflowHandle

from activities.model import ModelConfig
from activities.storage import read_trajectories
from workers.config import Settings
from workers.report import write_report
from workers.runner import connect_or_start, endpoint
from workers.worker import running_worker
from workflows.group import BatchRolloutWorkflow
from workflows.schema import BatchInput, BatchResult, RolloutLimits, RolloutOptions


@dataclass
class EvalOptions:
    """What `gymflow eval` runs."""

    env: str
    policy: str
    baseline: str | None = None
    n: int = 32
    """Tasks."""
    samples: int = 1
    """Samples per task (pass@k needs k <= samples)."""
    dataset: str = "generated"
    seed: int = 0
    model: str = ""
    tool_format: str = "native"
    window: int = 64
    max_turns: int = 10
    out: Path | None = None
    local_worker: bool = True
    reps: int = 2000


async def _start(
    client: Client, options: EvalOptions, settings: Settings, url: str, label: str
) -> WorkflowHandle[Any, BatchResult]:
    batch = BatchInput(
        env=options.env,
        dataset=options.dataset,
        dataset_options={"n": options.n, "seed": options.seed},
        num_tasks=options.n,
        samples_per_task=options.samples,
        options=RolloutOptions(
            model=ModelConfig(base_url=url, model=options.model, tool_format=options.tool_format),
            limits=RolloutLimits(max_turns=options.max_turns),
        ),
        window=options.window,
    )
    workflow_id = f"eval-{options.env}-{label}-{uuid.uuid4().hex[:8]}"
    return await client.start_workflow(BatchRolloutWorkflow.run, batch, id=workflow_id, task_queue=settings.task_queue)


async def _progress(handles: list[WorkflowHandle[Any, BatchResult]], total: int, out: TextIO) -> None:
    """Draw a progress bar from the batches' progress queries until they finish."""
    while True:
        done = 0
        for handle in handles:
            with contextlib.suppress(Exception):  # a query can race a continue-as-new; the next poll answers
                done += int((await handle.query(BatchRolloutWorkflow.progress))["completed"] or 0)
        filled = int(30 * done / max(total, 1))
        out.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} rollouts")
        out.flush()
        if done >= total:
            break
        await asyncio.sleep(0.5)
    out.write("\n")


async def run_eval(options: EvalOptions, settings: Settings, *, out: TextIO = sys.stderr) -> dict[str, Any]:
    """Run the evaluation; returns the report summary (also written to `options.out`)."""
    client = await connect_or_start(settings, start_server=False, out=out)
    policies = {"policy": options.policy} | ({"baseline": options.baseline} if options.baseline else {})
    async with contextlib.AsyncExitStack() as stack:
        if options.local_worker:
            await stack.enter_async_context(running_worker(client, settings))
        handles = {}
        for label, policy in policies.items():
            url = await stack.enter_async_context(endpoint(options.env, policy))
            handles[label] = await _start(client, options, settings, url, label)
        total = options.n * options.samples * len(handles)
        bar = asyncio.create_task(_progress(list(handles.values()), total, out))
        results = {label: await handle.result() for label, handle in handles.items()}
        await bar
    trajectories = {
        label: await read_trajectories(result.parts, s3_endpoint_url=settings.s3_endpoint_url)
        for label, result in results.items()
    }
    out_dir = options.out or settings.data_dir / "evals" / results["policy"].batch_id
    report = write_report(
        trajectories["policy"], out_dir, baseline=trajectories.get("baseline"), reps=options.reps, seed=options.seed
    )
    summary = report.model_dump(mode="json")
    summary["batches"] = {label: r.batch_id for label, r in results.items()}
    summary["out_dir"] = str(out_dir)
    return summary
