"""`gymflow train launch|list|status|logs|cancel`: training runs from the command line.

`launch` reads a run config (YAML, gymflow.activities.training_schema.RunConfig), refuses a bad one before
anything starts, naming every field at fault at once (gymflow.workers.sdk.training: the config's shape
and the static checks the workflow's validate activity makes), and starts a
TrainingRunWorkflow whose id is the run id: launching the same run id again attaches to the
existing run instead of starting a second one. `--wait` runs an in-process worker and follows the
run to its end; without it, the run needs running workers (`gymflow worker`: the training role, and
rollout workers for its evals; gymflow.workers.roles).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from gymflow.activities import names
from gymflow.activities.training_schema import RunConfig, TrainingRunInput, TrainingRunResult
from gymflow.workers.config import Settings
from gymflow.workers.sdk.training import check_run_config, read_config_data


def add_train_args(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `train` subcommands."""
    p = sub.add_parser("train", help="launch and follow training runs")
    tsub = p.add_subparsers(dest="train_command", required=True)
    launch = tsub.add_parser("launch", help="validate, bundle, upload, launch and watch a training run")
    common(launch)
    launch.add_argument("config", type=Path, help="run config (YAML)")
    launch.add_argument("--backend", choices=["local", "skypilot"], help="override trainer.backend")
    launch.add_argument("--run-id", help="override run_id (default: the config's, else a fresh one)")
    launch.add_argument(
        "--dryrun", action="store_true", help="check the config, print the trainer task, launch nothing"
    )
    launch.add_argument("--wait", action="store_true", help="run a worker here and follow the run to its end")
    launch.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    commands = {
        "list": "list training runs",
        "status": "a run's step, scalars, checkpoints and evals",
        "logs": "the trainer's last log lines",
        "cancel": "cancel a run (trainer stopped)",
    }
    for name, text in commands.items():
        q = tsub.add_parser(name, help=text)
        common(q)
        if name != "list":
            q.add_argument("run", help="run id")
        q.add_argument("--json", action="store_true")
        if name == "logs":
            q.add_argument("--lines", type=int, default=50)


def run_train(args: argparse.Namespace, settings: Settings) -> int:
    """Dispatch a `gymflow train ...` command; returns the exit code (a bad config: ConfigError)."""
    command = _launch if args.train_command == "launch" else _inspect
    return asyncio.run(command(args, settings))


def _config(args: argparse.Namespace) -> RunConfig:
    """The run config of `train launch`, with its overrides, checked: every field at fault named at once."""
    data = read_config_data(args.config)
    if args.run_id:
        data["run_id"] = args.run_id
    elif data.get("run_id") is None:
        data["run_id"] = f"{Path(str(data.get('env') or 'run')).stem}-{uuid.uuid4().hex[:8]}"
    if args.backend and isinstance(data.get("trainer", {}), dict):
        data["trainer"] = {**data.get("trainer", {}), "backend": args.backend}
    return check_run_config(data, source=args.config, require_skypilot=not args.dryrun)


def dryrun_text(config: RunConfig, settings: Settings) -> str:
    """What `--dryrun` prints: the trainer's SkyPilot task, or the local command, and the config."""
    from gymflow.activities import trainer_backends as backends
    from gymflow.deploy import launcher

    run_id = config.run_id or ""
    connection = settings.temporal_connection()
    env = {"GYMFLOW_RUN_ID": run_id, "GYMFLOW_RUN_SPEC": "<set at launch: runs/<run id>/run.json>",
           "GYMFLOW_TEMPORAL_ADDRESS": connection.address, "GYMFLOW_NAMESPACE": connection.namespace,
           "GYMFLOW_TASK_QUEUE": settings.task_queue, **config.trainer.env}  # fmt: skip
    if config.trainer.backend == "skypilot":
        resources = config.trainer.resources.model_dump(exclude_none=True)
        task = backends.task_config(
            Path(config.trainer.workdir) / config.trainer.task_file, env=env, resources=resources
        )
        header = f"# SkyPilot task of run {run_id} (cluster {backends.cluster_name(run_id)})\n"
        return header + launcher.render(task)
    shown = {"run_id": run_id, "backend": "local", "command": config.trainer.command,
             "workdir": str(Path(config.trainer.workdir).resolve()), "envs": env}  # fmt: skip
    return "# local trainer\n" + yaml.safe_dump(shown, sort_keys=False)


async def _launch(args: argparse.Namespace, settings: Settings, *, out: TextIO = sys.stderr) -> int:
    config = await asyncio.to_thread(_config, args)
    if args.dryrun:
        print(dryrun_text(config, settings), end="")
        return 0
    from gymflow.activities.errors import TRAINING_CONFIG
    from gymflow.workers.cli import exits
    from gymflow.workers.roles import COMMAND_ROLES
    from gymflow.workers.sdk import scripts
    from gymflow.workers.sdk.local import connect_or_start
    from gymflow.workers.worker import running_worker

    client = await connect_or_start(settings, start_server=False, out=out)
    if args.wait:
        # The in-process worker polls a queue of this run's own, keyed by the run id: launching
        # the same run with --wait again (after Ctrl-C, a crash) polls that queue again.
        settings = settings.command_queue("train", config.run_id)
        scripts.note_on_interrupt(
            f"run {config.run_id} goes on when `gymflow train launch` of it runs with --wait again"
        )
    handle = await start_run(client, config, task_queue=settings.task_queue, out=out)
    if not args.wait:
        print(f"run {handle.id} started; follow it with `gymflow train status {handle.id}`", file=out)
        return 0
    queue = (await handle.describe()).task_queue
    async with contextlib.AsyncExitStack() as stack:
        if queue == names.training_queue(settings.task_queue):
            await stack.enter_async_context(running_worker(client, settings, roles=COMMAND_ROLES["train"]))
        else:  # a run launched without --wait: the workers of its queue drive it, this only follows
            print(f"run {handle.id} runs on task queue {queue!r}: following it, its workers drive it", file=out)
        result = await follow(handle, out=out)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    if result.get("error_type") == TRAINING_CONFIG:  # the config was at fault, as with a refusal before the start
        return exits.USER_ERROR
    return 0 if result.get("status") == "completed" else 1


async def start_run(client: Client, config: RunConfig, *, task_queue: str, out: TextIO) -> WorkflowHandle[Any, Any]:
    """Start the run, or attach to the run that already has this id (one run per id).

    `task_queue` is the deployment's shared queue: the run goes to its training queue
    (`names.training_queue`), and its eval batches and trainer's rollouts to the shared queue itself.
    """
    from gymflow.workflows.training import TrainingRunWorkflow

    run_id = config.run_id or ""
    try:
        return await client.start_workflow(
            TrainingRunWorkflow.run,
            TrainingRunInput(config=config),
            id=run_id,
            task_queue=names.training_queue(task_queue),
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=TypedSearchAttributes(names.start_attributes(config.env, run=run_id)),
            memo={"run_id": run_id},
            static_summary=f"training run {run_id} ({config.env}, {config.trainer.backend})",
        )
    except WorkflowAlreadyStartedError:
        print(f"run {run_id} already exists: not launching another; following it", file=out)
        return client.get_workflow_handle(run_id)


async def follow(handle: WorkflowHandle[Any, Any], *, out: TextIO, poll_s: float = 2.0) -> dict[str, Any]:
    """Print the run's progress until it ends; returns its result (or failure) as a dict."""
    seen: set[str] = set()
    last_step = None
    result_task = asyncio.ensure_future(handle.result())
    while not result_task.done():
        with contextlib.suppress(Exception):  # a query can race a continue-as-new or the end
            progress = await handle.query("progress")
            if progress["step"] != last_step and progress["step"] >= 0:
                last_step = progress["step"]
                scalars = ", ".join(f"{k} {v:.3g}" for k, v in progress["scalars"].items())
                print(f"[{progress['phase']}] step {last_step}: {scalars}", file=out)
            for checkpoint in progress["checkpoints"]:
                ev = checkpoint.get("eval")
                if ev and checkpoint["report"]["name"] not in seen:
                    seen.add(checkpoint["report"]["name"])
                    print(f"  eval {format_eval(ev)}", file=out)
        await asyncio.wait([result_task], timeout=poll_s)
    try:
        result = TrainingRunResult.model_validate(result_task.result())
    except WorkflowFailureError as exc:
        cause = exc.cause
        message = getattr(cause, "message", None) or str(cause or exc)
        print(f"run {handle.id} failed: {message}", file=out)
        return {"run_id": handle.id, "status": "failed", "message": message, "error_type": getattr(cause, "type", None)}
    print(f"run {handle.id} {result.status}: {result.steps} steps, manifest {result.manifest_uri}", file=out)
    return result.model_dump(mode="json")


def format_eval(ev: dict[str, Any]) -> str:
    if ev.get("error"):
        return f"{ev['checkpoint']}: {ev['error']}"
    return (f"{ev['checkpoint']}: reward {ev['mean']:.3f} [{ev['mean_low']:.3f}, {ev['mean_high']:.3f}] vs baseline "
            f"{ev['baseline_mean']:.3f}, P(improvement) {ev['probability_of_improvement']:.3f} "
            f"[{ev['poi_low']:.3f}, {ev['poi_high']:.3f}] over {ev['n_tasks']} tasks")  # fmt: skip


async def _inspect(args: argparse.Namespace, settings: Settings) -> int:
    from gymflow.workers.sdk.local import connect_or_start

    client = await connect_or_start(settings, start_server=False, out=sys.stderr)
    if args.train_command == "list":
        rows = []
        async for execution in client.list_workflows(f'WorkflowType="{names.TRAINING_WORKFLOW}"'):
            status = execution.typed_search_attributes.get(names.SA_STATUS) or (
                execution.status.name.lower() if execution.status else None
            )
            env = execution.typed_search_attributes.get(names.SA_ENV)
            rows.append({"run_id": execution.id, "status": status, "env": env,
                         "workflow_status": execution.status.name if execution.status else None,
                         "started": execution.start_time.isoformat()})  # fmt: skip
        if args.json:
            print(json.dumps(rows, indent=2))
        for row in [] if args.json else rows:
            print(f"{row['run_id']:<32} {row['status'] or '-':<10} {row['env'] or '-':<12} {row['started']}")
        return 0
    handle = client.get_workflow_handle(args.run)
    if args.train_command == "cancel":
        await handle.cancel()
        print(f"cancel requested for run {args.run}; the trainer is stopped and every child cancelled", file=sys.stderr)
        return 0
    description = await handle.describe()
    progress = await _progress(handle, description.status)
    if args.train_command == "logs":
        print(trainer_logs(progress, args.lines))
        return 0
    # GymflowStatus is written when the run closes; until then Temporal's own status says it runs.
    status = description.typed_search_attributes.get(names.SA_STATUS) or (
        description.status.name.lower() if description.status else None
    )
    summary = {"run_id": args.run, "status": status, "memo": await description.memo(), **(progress or {})}
    summary.pop("history", None)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    print(f"run {args.run}: {status} (phase {summary.get('phase', '-')}, step {summary.get('step', '-')})")
    for key, value in (summary.get("scalars") or {}).items():
        print(f"  {key}: {value:.4g}")
    for checkpoint in summary.get("checkpoints") or []:
        ev = checkpoint.get("eval")
        print(f"  checkpoint {checkpoint['report']['name']}: " + (format_eval(ev) if ev else "eval pending"))
    return 0


async def _progress(handle: WorkflowHandle[Any, Any], status: WorkflowExecutionStatus | None) -> dict[str, Any] | None:
    try:
        return dict(await asyncio.wait_for(handle.query("progress"), 20))
    except Exception:  # a closed run without a worker to answer: fall back to the memo
        del status
        return None


def trainer_logs(progress: dict[str, Any] | None, lines: int) -> str:
    """The trainer's last log lines (local: its log file; SkyPilot: the job's logs)."""
    from gymflow.activities import trainer_backends as backends

    launch = (progress or {}).get("launch")
    if not launch:
        return "(the trainer has not been launched)"
    if launch["backend"] == "skypilot":
        return backends.skypilot_tail(launch["run_id"], launch["job_id"], lines)
    return backends.tail_file(Path(launch["log"]), lines)
