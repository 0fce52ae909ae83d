"""What the `gymflow` commands do, once parsed (gymflow.workers.cli.main builds the parser and dispatches)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from typing import Any

from gymflow.envs.errors import EnvUnavailableError, UserError
from gymflow.envs.registry import env_class
from gymflow.workers.config import Settings
from gymflow.workers.servers import temporal as embedded


class UsageError(UserError):
    """Arguments that do not go together (the CLI's one line, exit 2)."""


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """`--json` output: valid JSON always (NaN and infinities become null, never `NaN`)."""
    return json.dumps(_finite(value), indent=2, default=str, allow_nan=False)


def server(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "setup":
        return asyncio.run(server_setup(settings))
    if args.stop:
        stopped = embedded.stop_background(data_dir=settings.data_dir, port=args.port)
        print("server stopped" if stopped else f"no server runs on data dir {settings.data_dir}", file=sys.stderr)
        return 0
    # The server listens where the workers and clients of this config connect (--address /
    # GYMFLOW_TEMPORAL_ADDRESS) unless --port says otherwise.
    port = args.port or settings.frontend_port
    ui_port = args.ui_port or port + 1000
    if args.background:
        pid = embedded.start_background(data_dir=settings.data_dir, port=port, ui_port=ui_port)
        print(f"Temporal server started (pid {pid}) on :{port}; UI at http://localhost:{ui_port}", file=sys.stderr)
        return 0
    embedded.exec_foreground(data_dir=settings.data_dir, port=port, ui_port=ui_port)


async def server_setup(settings: Settings) -> int:
    """`gymflow server setup`: register gymflow's search attributes on the configured cluster (one you operate)."""
    from gymflow.workers.client import connect

    connection = settings.temporal_connection()
    client = await connect(connection=connection, check_search_attributes=False)
    added = await embedded.setup(client, connection)
    where = f"namespace {connection.namespace} at {connection.address}"
    if added:
        print(f"registered {', '.join(added)} on {where}", file=sys.stderr)
    else:
        print(f"{where} has every gymflow search attribute already", file=sys.stderr)
    return 0


def codec_server(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from gymflow.workers.client import encryption_codec
    from gymflow.workers.servers.codec import codec_app

    codec = encryption_codec(settings)  # a malformed key: CodecKeyError, naming the variable
    if codec is None:
        print("gymflow codec-server: set GYMFLOW_ENCRYPTION_KEY (the key the workers encrypt with)", file=sys.stderr)
        return 2
    port = settings.web_ui_port
    origins = args.origins or [f"http://localhost:{port}", f"http://127.0.0.1:{port}"]
    # The value the temporal CLI sends (`--codec-auth`, TEMPORAL_CODEC_AUTH) unless gymflow's own is set.
    auth = settings.codec_auth.get_secret_value() if settings.codec_auth else os.environ.get("TEMPORAL_CODEC_AUTH")
    app = codec_app(codec, origins=origins, authorization=auth)
    login = f"; browsers log in once at http://localhost:{args.port}/login" if auth else ""
    print(
        f"codec server on http://{args.host}:{args.port} (key {codec.key_id}; origins {', '.join(origins)}; "
        f"auth {'required' if auth else 'off'}{login})",
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", log_config=None)
    return 0


def preflight(env: str, *, local_worker: bool = True) -> None:
    """Refuse an env that cannot work on this node when this command runs its rollouts here, and
    say once what weakens it (e.g. an opted-out code sandbox).

    Raises:
        EnvUnavailableError: `local_worker` and the env cannot work here; the message names the fix.
    """
    cls = env_class(env)
    if local_worker:  # with --no-worker the rollouts run on other nodes, which answer for themselves
        problem = cls.unavailable()
        if problem is not None:
            raise EnvUnavailableError(f"{env} cannot work on this node: {problem}")
    notice = cls.preflight()
    if notice:
        print(f"gymflow: {notice}", file=sys.stderr)


def check_policies(env: str, *policies: str | None) -> None:
    """Refuse a mistyped baseline policy name (gymflow.envs.errors.UnknownPolicy) before anything starts."""
    from gymflow.workers.sdk.local import is_url

    for policy in policies:
        if policy and not is_url(policy):
            env_class(env).baseline_policy(policy)


def batch(args: argparse.Namespace, settings: Settings) -> int:
    from gymflow.workers.cli.runner import BatchOptions, format_table, run_batch

    preflight(args.env, local_worker=not getattr(args, "no_worker", False))
    check_policies(args.env, None if args.model_url else args.policy)
    options = BatchOptions(
        env=args.env,
        n=args.n,
        seed=args.seed,
        dataset=args.dataset,
        model_url=args.model_url,
        model=args.model,
        tool_format=args.tool_format,
        tokens=args.tokens,
        policy=args.policy,
        concurrency=args.concurrency,
        max_turns=args.max_turns,
        local_worker=not getattr(args, "no_worker", False),
        start_server=args.command == "demo",
    )
    report = asyncio.run(run_batch(options, settings))
    if args.json:
        print(json_text({"summary": report.summary(), "rollouts": report.rows()}))
    else:
        print(format_table(report))
        print(f"\nOpen the batch in the Temporal Web UI: {report.ui_url}")
    if args.command == "demo":
        if args.stop_server:
            embedded.stop_background(data_dir=settings.data_dir)
        elif embedded.running(settings.data_dir) is not None:
            note = "The Temporal server keeps running for the UI; stop it with `gymflow server --stop`."
            print(note, file=sys.stderr)
    return 0 if report.summary()["infra_failed"] == 0 else 1


def evaluate(args: argparse.Namespace, settings: Settings) -> int:
    from gymflow.workers.sdk.evals import EvalOptions, format_summary, run_eval

    if args.env == RESCORE:
        return rescore(args, settings)
    if args.batch is not None or args.reward is not None:
        raise UsageError(f"`gymflow eval {args.env}` takes no BATCH or --reward (those are `gymflow eval rescore`'s)")
    preflight(args.env, local_worker=not args.no_worker)
    check_policies(args.env, args.policy, args.baseline)
    options = EvalOptions(
        env=args.env,
        policy=args.policy,
        baseline=args.baseline,
        n=args.n,
        samples=args.samples,
        dataset=args.dataset,
        seed=args.seed,
        model=args.model,
        tool_format=args.tool_format,
        window=args.window,
        max_turns=args.max_turns,
        out=args.out,
        local_worker=not args.no_worker,
        reps=args.reps,
        resume=args.resume,
    )
    summary = asyncio.run(run_eval(options, settings, announce=not args.json))
    print(json_text(summary) if args.json else format_summary(summary))
    return 0


RESCORE = "rescore"
"""`gymflow eval rescore BATCH --reward SPEC`: the word in the env's place."""


def rescore(args: argparse.Namespace, settings: Settings) -> int:
    """`gymflow eval rescore BATCH --reward SPEC` (gymflow.workers.sdk.rescore)."""
    from gymflow.workers.sdk.rescore import RescoreOptions, format_rescore, rescore_batch

    if args.batch is None or args.reward is None:
        raise UsageError("usage: gymflow eval rescore BATCH --reward SPEC (both are needed)")
    if args.resume is not None:
        raise UsageError("`gymflow eval rescore` rescores a finished batch: --resume is `gymflow eval ENV`'s")
    options = RescoreOptions(
        batch=args.batch,
        reward=args.reward,
        out=args.out,
        local_worker=not args.no_worker,
        reps=args.reps,
        seed=args.seed,
    )
    summary = asyncio.run(rescore_batch(options, settings, announce=not args.json))
    print(json_text(summary) if args.json else format_rescore(summary))
    return 0


def dataset(args: argparse.Namespace, settings: Settings) -> int:
    from gymflow.workers.sdk import datasets

    if args.dataset_command == "show":
        try:
            summary = datasets.show(args.uri, samples=args.samples)
        except (OSError, ValueError) as exc:
            print(f"gymflow dataset show: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(summary, indent=2) if args.json else datasets.format_show(summary))
        return 0
    options = datasets.GenerateOptions(
        source=args.source, n=args.n, out=args.out, env=args.env, generator=args.generator,
        model_url=args.model_url, model=args.model, judge_url=args.judge_url, seed=args.seed,
        eval_fraction=args.eval_fraction, batch_size=args.batch_size, local_worker=not args.no_worker,
        skip_filters=tuple(args.skip_filter or ()),
    )  # fmt: skip
    try:
        result = asyncio.run(datasets.run_generate(options, settings))
    except ValueError as exc:  # a bad --source or option
        print(f"gymflow dataset generate: {exc}", file=sys.stderr)
        return 2
    # A failed workflow (a corpus with no usable document, ...) is one line from gymflow.workers.cli.exits.
    if args.json:
        print(result.model_dump_json(indent=2))
        for line in datasets.shortfall(result):  # stdout stays JSON
            print(line, file=sys.stderr)
    else:
        print(datasets.format_result(result))
    return 0 if result.target_met else 1


async def look(args: argparse.Namespace, settings: Settings) -> int:
    """`gymflow inspect` and `gymflow status`: read-only views of what the server holds."""
    from temporalio.service import RPCError

    from gymflow.workers.cli import inspect, status
    from gymflow.workers.sdk.local import connect_or_start

    client = await connect_or_start(settings, start_server=False, out=sys.stderr)
    if args.command == "status":
        found = await status.collect(client, ui_url=settings.ui_url)
        print(json_text(found.as_json()) if args.json else status.render(found))
        return 0
    try:
        seen = await inspect.inspect_workflow(client, args.workflow_id, run_id=args.run_id, ui_url=settings.ui_url)
    except RPCError as exc:
        print(f"gymflow inspect: {args.workflow_id}: {exc.message}", file=sys.stderr)
        return 2
    print(json_text(seen.as_json()) if args.json else inspect.render(seen, width=None if args.full else 160))
    return 0


def deploy(args: argparse.Namespace, settings: Settings) -> int:
    from gymflow.deploy import launcher

    try:
        return _deploy_with(launcher, args, settings)
    except (RuntimeError, ValueError) as exc:  # skypilot missing, workers already running, bad --nodes
        print(f"gymflow deploy: {exc}", file=sys.stderr)
        return 2


def _deploy_with(launcher: Any, args: argparse.Namespace, settings: Settings) -> int:
    if args.deploy_command == "down":
        if args.backend == "local":
            stopped = launcher.down_local(data_dir=settings.data_dir)
            print(f"stopped {len(stopped)} local worker(s)", file=sys.stderr)
        else:
            launcher.down_skypilot(args.cluster)
        return 0
    connection = settings.temporal_connection()  # its credentials go as SkyPilot secrets and files
    spec = launcher.FleetSpec(
        nodes=args.nodes,
        temporal_address=connection.address,
        task_queue=settings.task_queue,
        namespace=connection.namespace,
        connection=connection,
        roles=settings.worker_roles,
        infra=args.infra,
        cluster=args.cluster,
        task_file=args.task_file or launcher.TASK_FILE,
    )
    if args.dryrun:
        print(launcher.render(launcher.task_config(spec)), end="")
        return 0
    if args.backend == "local":
        nodes = launcher.launch_local(spec, data_dir=settings.data_dir)
        for node in nodes:
            print(f"rank {node.rank}: pid {node.pid}, log {node.log}", file=sys.stderr)
        return 0
    job_id = launcher.launch_skypilot(spec)
    print(f"launched {args.nodes} worker node(s) on cluster {args.cluster} (job {job_id})", file=sys.stderr)
    return 0
