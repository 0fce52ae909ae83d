"""`gymflow eval`: a policy (and optionally a baseline) on an env's dataset, with honest statistics.

Each policy runs as one BatchRolloutWorkflow (durable, windowed, results in storage). A policy
is an OpenAI-compatible URL or the name of one of the env's built-in baseline policies, which is
then served locally over real HTTP. While batches run, a progress bar reads the batches' progress
query; at the end the trajectories are read back from storage and `gymflow.workers.sdk.report` writes
report.json, report.md and plots with bootstrap confidence intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from temporalio.client import Client, WorkflowHandle
from temporalio.common import TypedSearchAttributes

from gymflow.activities.batches import FoundBatch, find_batch
from gymflow.activities.model import ModelConfig
from gymflow.activities.resume import BatchLayout, check_resumable
from gymflow.activities.schema import (
    BatchInput,
    BatchResult,
    BatchState,
    RolloutLimits,
    RolloutOptions,
    batch_search_attributes,
)
from gymflow.activities.storage import read_trajectories
from gymflow.envs.errors import BatchError
from gymflow.envs.eval.report import BatchRef
from gymflow.envs.registry import env_class
from gymflow.envs.runtime.admission import Capacity
from gymflow.workers.config import Settings
from gymflow.workers.roles import COMMAND_ROLES
from gymflow.workers.sdk import scripts
from gymflow.workers.sdk.local import connect_or_start, endpoint, is_url
from gymflow.workers.sdk.progress import Progress, Reading, follow
from gymflow.workers.sdk.report import write_report
from gymflow.workers.worker import running_worker
from gymflow.workflows.group import BatchRolloutWorkflow


@dataclass
class EvalOptions:
    """What `gymflow eval` runs."""

    env: str
    policy: str
    baseline: str | None = None
    n: int | None = None
    """Tasks; None: 32, or every task of a dataset an env sizes itself (harbor: the task directories)."""
    samples: int = 1
    """Samples per task (pass@k needs k <= samples)."""
    dataset: str = "generated"
    seed: int = 0
    model: str = ""
    tool_format: str = "native"
    window: int | None = None
    """Rollouts in flight per batch; None: what this machine holds (`Capacity.window`)."""
    max_turns: int = 10
    out: Path | None = None
    local_worker: bool = True
    reps: int = 2000
    resume: str | None = None
    """A batch of this env to resume (`--resume BATCH`): its finished rollouts are carried over and only
    the missing or infra-failed ones run, on its tasks, samples and limits (`n`, `samples`, `dataset`
    and `seed` are the old batch's then). If it is still open it is terminated first."""


DEFAULT_TASKS = 32


def prepared(options: EvalOptions) -> EvalOptions:
    """`options` with the dataset and task count the env settles: an env with `prepare_dataset`
    (harbor) loads and checks its dataset here, before anything starts, and sizes it."""
    prepare = getattr(env_class(options.env), "prepare_dataset", None)
    if prepare is None:
        return replace(options, n=options.n or DEFAULT_TASKS)
    dataset, n = prepare(options.dataset, options.n)
    return replace(options, dataset=dataset, n=n)


async def _start(
    client: Client,
    options: EvalOptions,
    settings: Settings,
    url: str,
    *,
    label: str,
    policy: str,
    resume: FoundBatch | None = None,
) -> WorkflowHandle[Any, BatchResult]:
    model = options.model or ("" if is_url(policy) else policy)
    assert options.n is not None  # prepared()
    batch = (
        resumed_input(resume, options, url, model=model, policy=policy)
        if resume
        else BatchInput(
            env=options.env,
            dataset=options.dataset,
            dataset_options={"n": options.n, "seed": options.seed},
            num_tasks=options.n,
            samples_per_task=options.samples,
            options=RolloutOptions(
                model=ModelConfig(base_url=url, model=model, tool_format=options.tool_format),
                limits=RolloutLimits(max_turns=options.max_turns),
            ),
            window=options.window or Capacity.detect().window,
            label=policy,
        )
    )
    workflow_id = f"eval-{options.env}-{label}-{uuid.uuid4().hex[:8]}"
    memo = {"resumed_from": resume.batch_id} if resume else None
    return await client.start_workflow(
        BatchRolloutWorkflow.run,
        batch,
        id=workflow_id,
        task_queue=settings.task_queue,
        search_attributes=TypedSearchAttributes(batch_search_attributes(batch, workflow_id)),
        memo=memo,
    )


def resumed_input(old: FoundBatch, options: EvalOptions, url: str, *, model: str, policy: str) -> BatchInput:
    """The input of a batch resuming `old`: its tasks, samples, envs, limits and storage, this command's
    policy endpoint and window."""
    config = old.input.options.model.model_copy(
        update={"base_url": url, "model": model, "tool_format": options.tool_format}
    )
    return old.input.model_copy(
        update={
            "options": old.input.options.model_copy(update={"model": config}),
            "window": options.window or Capacity.detect().window,
            "label": policy,
            "resumed_from": old.batch_id,
            "state": BatchState(),
        }
    )


async def resumable(client: Client, options: EvalOptions) -> tuple[EvalOptions, FoundBatch]:
    """The batch `options.resume` names, checked to be of `options.env`, and the options sized to it.

    Raises:
        BatchError: No such batch, another env's, a rescored one, or a baseline asked for too.
    """
    assert options.resume is not None
    if options.baseline:
        raise BatchError("--resume continues one batch: leave out --baseline (resume each batch on its own)")
    found = await find_batch(client, options.resume)
    check_resumable(found, BatchLayout.of(found.input).model_copy(update={"env": options.env}))
    old = found.input
    n = old.num_tasks or len(old.tasks) or DEFAULT_TASKS
    return replace(options, n=n, samples=old.samples_per_task * (1 + len(old.also_envs))), found


async def _completed(handles: list[WorkflowHandle[Any, BatchResult]]) -> Reading:
    done = 0
    for handle in handles:
        done += int((await handle.query(BatchRolloutWorkflow.progress))["completed"] or 0)
    return done, "rollouts"


async def run_eval(
    options: EvalOptions, settings: Settings, *, out: TextIO = sys.stderr, announce: bool = True
) -> dict[str, Any]:
    """Run the evaluation; returns the report summary (also written to `options.out`)."""
    client = await connect_or_start(settings, start_server=False, out=out)
    resume: FoundBatch | None = None
    if options.resume:
        options, resume = await resumable(client, options)
    else:
        options = prepared(options)
    assert options.n is not None
    if options.local_worker:  # its own queue: no other command's workflows, none of its own elsewhere
        settings = settings.command_queue("eval")
        scripts.note_queue_on_interrupt(settings.task_queue)
    policies = {"policy": options.policy} | ({"baseline": options.baseline} if options.baseline else {})
    async with contextlib.AsyncExitStack() as stack:
        if options.local_worker:
            await stack.enter_async_context(running_worker(client, settings, roles=COMMAND_ROLES["eval"]))
        handles = {}
        for label, policy in policies.items():
            url = await stack.enter_async_context(endpoint(options.env, policy))
            handles[label] = await _start(client, options, settings, url, label=label, policy=policy, resume=resume)
            if announce:  # off under `--json`: stderr holds log lines and progress only (the summary has the links)
                print(f"{label} batch {handles[label].id}: {_ui(settings, handles[label].id)}", file=out)
        total = options.n * options.samples * len(handles)
        finished = asyncio.Event()
        progress = Progress(out, total)
        bar = asyncio.create_task(follow(progress, lambda: _completed(list(handles.values())), finished))
        results: dict[str, BatchResult] = {}
        try:
            for label, handle in handles.items():
                results[label] = await handle.result()
        finally:
            finished.set()
            last, _ = await bar
            done = sum(r.completed + r.infra_failed for r in results.values())
            progress.close(done if len(results) == len(handles) else last, "rollouts")
    trajectories = {
        label: await read_trajectories(result.parts, s3_endpoint_url=settings.s3_endpoint_url)
        for label, result in results.items()
    }
    out_dir = options.out or settings.data_dir / "evals" / results["policy"].batch_id
    ui = settings.ui_url
    batches = [
        BatchRef(
            role=role,
            batch_id=result.batch_id,
            label=policies[role],
            ui=_ui(settings, result.batch_id),
            report=result.report,
            lineage=f"resumes {result.resumed_from} ({result.carried} finished rollouts carried over)"
            if result.resumed_from
            else None,
            rollout_batches=[result.batch_id, result.resumed_from] if result.resumed_from else [],
        )
        for role, result in results.items()
    ]
    report = write_report(
        trajectories["policy"],
        out_dir,
        baseline=trajectories.get("baseline"),
        reps=options.reps,
        seed=options.seed,
        labels=(options.policy, options.baseline or "baseline"),
        batches=batches,
        ui_base=ui,
    )
    summary = report.model_dump(mode="json")
    summary["out_dir"] = str(out_dir)
    summary["report"] = str(out_dir / "report.html")
    summary["results"] = {role: result.model_dump(mode="json") for role, result in results.items()}
    return summary


def _ui(settings: Settings, batch_id: str) -> str:
    """The batch's rollouts in the Web UI."""
    return f"{settings.ui_url}/workflows?query=" + quote(f'GymflowBatch="{batch_id}"')


def format_summary(summary: dict[str, Any]) -> str:
    """A few lines for a terminal: each side's mean with its CI, the difference, where the report is."""

    def ci(e: dict[str, Any] | None) -> str:
        if not e:
            return "-"
        low, high = e.get("low"), e.get("high")
        return f"{e['value']:.3f}" + ("" if low is None or high is None else f" [{low:.3f}, {high:.3f}]")

    lines = [f"{', '.join(summary['envs'])}: {' vs '.join(b['label'] for b in summary['batches'])}"]
    for role in ("policy", "baseline"):
        side = summary.get(role)
        if side:
            lines.append(
                f"  {side['label']} ({role}): {side['rollouts']} rollouts, {side['completed']} scored, "
                f"{side['infra_failed']} infra-failed; mean reward {ci(side['mean'])}"
            )
    if summary.get("comparison"):
        lines.append(f"  difference (policy - baseline): {ci(summary['comparison']['difference'])}")
    lines += [f"  UNSAFE SANDBOX: {line}" for line in summary.get("sandbox", [])]
    lines.append(f"report: {summary['report']} (and report.json)")
    lines += [f"{b['role']} batch {b['batch_id']}: {b['ui']}" for b in summary["batches"]]
    lines += [f"{b['role']} batch report: {b['report']}" for b in summary["batches"] if b.get("report")]
    lines += [f"{b['role']} batch {b['batch_id']} {b['lineage']}" for b in summary["batches"] if b.get("lineage")]
    return "\n".join(lines)
