"""The `gymflow` command line. Names here are stable: other tools and docs rely on them."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envs.registry import EnvFileError, UnknownEnvError, available, env_class
from workers import logs
from workers import server as embedded
from workers.config import Settings


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


class SettingsError(ValueError):
    """A GYMFLOW_* variable (or option) that is not a valid setting."""


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        key: value
        for key, value in {
            "temporal_address": getattr(args, "address", None),
            "task_queue": getattr(args, "task_queue", None),
            "data_dir": getattr(args, "data_dir", None),
            "ui_port": getattr(args, "ui_port", None),
            "worker_processes": getattr(args, "processes", None),
        }.items()
        if value is not None
    }
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(f"invalid setting (a GYMFLOW_* variable): {exc}") from exc


def _processes(text: str) -> int | str:
    from workers.processes import parse_processes

    try:
        return parse_processes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--processes ")) from exc


def _worker_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run a worker (shared queue + this node's queue)")
    _common(p)
    p.add_argument(
        "--processes",
        type=_processes,
        help="worker processes on this node: N or `auto` (one per core); default 1 (GYMFLOW_WORKER_PROCESSES)",
    )


def _batch_args(parser: argparse.ArgumentParser, *, n: int) -> None:
    parser.add_argument("env", nargs="?", default="math", help="env name (see `gymflow envs`)")
    parser.add_argument("--n", type=int, default=n, help="number of rollouts")
    parser.add_argument("--seed", type=int, default=0, help="dataset seed")
    parser.add_argument("--dataset", default="generated", help="`generated` or a dataset path")
    parser.add_argument("--model-url", help="OpenAI-compatible endpoint (…/v1); default: the env's baseline policy")
    parser.add_argument("--model", default="", help="model name sent to the endpoint")
    parser.add_argument("--tool-format", choices=["native", "hermes"], default="native")
    parser.add_argument(
        "--tokens", choices=["off", "vllm", "sglang"], default="off", help="record token ids/logprobs (in --json)"
    )
    parser.add_argument("--policy", default="default", help="baseline policy name when no --model-url")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="Temporal frontend host:port (GYMFLOW_TEMPORAL_ADDRESS)")
    parser.add_argument("--task-queue", help="shared task queue (GYMFLOW_TASK_QUEUE)")
    parser.add_argument("--data-dir", type=Path, help="server data directory (GYMFLOW_DATA_DIR)")
    parser.add_argument(
        "--ui-port",
        type=int,
        help="Web UI port (GYMFLOW_UI_PORT; default: what `gymflow server` recorded, else port + 1000)",
    )


def _deploy_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow deploy workers|down`: worker fleets on SkyPilot or as local processes."""
    p = sub.add_parser("deploy", help="launch or stop a worker fleet (SkyPilot, or local processes)")
    dsub = p.add_subparsers(dest="deploy_command", required=True)
    for name, text in (("workers", "start N worker nodes"), ("down", "stop the fleet")):
        d = dsub.add_parser(name, help=text)
        _common(d)
        d.add_argument("--backend", choices=["skypilot", "local"], default="skypilot")
        d.add_argument("--cluster", default="gymflow-workers", help="SkyPilot cluster name")
        if name == "workers":
            d.add_argument("--nodes", type=int, default=1, help="number of worker nodes")
            d.add_argument("--infra", help="SkyPilot infra (aws, gcp/us-central1, k8s, ...)")
            d.add_argument("--task-file", type=Path, help="SkyPilot task YAML (default: deploy/workers.yaml)")
            d.add_argument("--dryrun", action="store_true", help="print the task, launch nothing")


def _look_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow inspect` and `gymflow status`."""
    p = sub.add_parser("inspect", help="a rollout's turns, tool calls, reward and timings, from its history")
    _common(p)
    p.add_argument("workflow_id", metavar="ROLLOUT_ID", help="workflow id of a rollout (or of a batch / group)")
    p.add_argument("--run-id", help="a specific run (default: the latest)")
    p.add_argument("--full", action="store_true", help="do not shorten tool results and replies")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")

    p = sub.add_parser("status", help="running batches, groups, dataset and training runs, with progress")
    _common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def _codec_server_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow codec-server`: Temporal's codec server protocol over the payload encryption keys."""
    p = sub.add_parser("codec-server", help="serve the payload codec so the Web UI / temporal CLI can read rollouts")
    _common(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (keep it private)")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument(
        "--origin",
        action="append",
        dest="origins",
        help="browser origin allowed to call it (repeatable; default: the Web UI, http://localhost:UI_PORT)",
    )


def _dataset_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow dataset generate|show`: DatasetGenerationWorkflow runs and the datasets they write."""
    p = sub.add_parser("dataset", help="generate a dataset (corpus, traces, env generator) or show one")
    dsub = p.add_subparsers(dest="dataset_command", required=True)
    g = dsub.add_parser("generate", help="run a DatasetGenerationWorkflow with a progress bar")
    _common(g)
    g.add_argument("--source", required=True, help="corpus:DIR|s3://..., traces:FILE, or env:NAME")
    g.add_argument("--n", type=int, required=True, help="accepted items wanted")
    g.add_argument(
        "--out", help="dataset URI: a directory or s3://bucket/prefix (default: <data dir>/results/datasets/ID)"
    )
    g.add_argument("--env", help="env the rows are for (default: search, traces, or the source env)")
    g.add_argument("--generator", choices=["offline", "model"], default="offline")
    g.add_argument("--model-url", help="OpenAI-compatible endpoint (…/v1) for --generator model")
    g.add_argument("--model", default="", help="model name sent to the endpoint")
    g.add_argument("--judge-url", help="judge endpoint (…/v1): grounding check / trace reward labels")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--eval-fraction", type=float, default=0.2)
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--no-worker", action="store_true", help="rely on running workers instead of an in-process one")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    s = dsub.add_parser("show", help="counts, rejections by reason and samples of a dataset")
    s.add_argument("uri", help="dataset directory or URI")
    s.add_argument("--samples", type=int, default=3)
    s.add_argument("--json", action="store_true")


def _train_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow train launch|list|status|logs|cancel` (workers.train_cli)."""
    from workers.train_cli import add_train_args

    add_train_args(sub, _common)


def _log_args(parser: argparse.ArgumentParser, *, top: bool = True) -> None:
    """`-v` and `--log-format`, before the subcommand or after it (`gymflow eval math --log-format json`)."""
    # On a subcommand an absent flag sets nothing, so the value given before the subcommand stands.
    absent: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO (default: WARNING)", **absent)
    parser.add_argument(
        "--log-format",
        choices=logs.LOG_FORMATS,
        help="log lines on stderr: json, console, or auto (console on a terminal, else JSON lines)",
        **(absent or {"default": "auto"}),
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _log_args(subparser, top=False)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="gymflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("server", help="run the embedded Temporal server (UI on --port + 1000: 8233)")
    _common(p)
    p.add_argument("--port", type=int, help="frontend port (default: the port of --address, else 7233)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--background", action="store_true", help="start detached and return")
    mode.add_argument("--stop", action="store_true", help="stop a server started with --background or by demo")

    _worker_args(sub)

    p = sub.add_parser("demo", help="server + worker + baseline policy + a batch of real rollouts")
    _common(p)
    _batch_args(p, n=16)
    p.add_argument("--stop-server", action="store_true", help="stop the server the demo started when done")

    p = sub.add_parser("rollout", help="run rollouts of an env and print their rewards")
    _common(p)
    _batch_args(p, n=1)
    p.add_argument("--no-worker", action="store_true", help="rely on running workers instead of an in-process one")

    p = sub.add_parser("eval", help="evaluate a policy (vs a baseline) with bootstrap confidence intervals")
    _common(p)
    p.add_argument("env", help="env name")
    p.add_argument("--policy", default="default", help="an OpenAI-compatible URL (…/v1) or a baseline policy name")
    p.add_argument("--baseline", help="a second policy to compare against (URL or baseline name)")
    p.add_argument("--n", type=int, default=32, help="number of tasks")
    p.add_argument("--samples", type=int, default=1, help="samples per task (for pass@k)")
    p.add_argument("--dataset", default="generated", help="`generated`, a dataset path or URI (search: a dataset URI)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="", help="model name sent to the endpoint")
    p.add_argument("--tool-format", choices=["native", "hermes"], default="native")
    p.add_argument(
        "--window",
        type=int,
        help="rollouts in flight per batch (default: 16 per core of this machine, as memory allows)",
    )
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--out", type=Path, help="report directory (default: <data dir>/evals/<batch id>)")
    p.add_argument("--no-worker", action="store_true", help="rely on running workers instead of an in-process one")
    p.add_argument("--json", action="store_true", help="print the report summary as JSON")

    p = sub.add_parser("policy", help="baseline policies")
    psub = p.add_subparsers(dest="policy_command", required=True)
    serve = psub.add_parser("serve", help="serve an env's baseline policy as an OpenAI-compatible endpoint")
    serve.add_argument("env")
    serve.add_argument("--policy", default="default")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)

    _look_args(sub)
    _codec_server_args(sub)
    _deploy_args(sub)
    _dataset_args(sub)
    _train_args(sub)
    sub.add_parser("envs", help="list the registered envs")
    _log_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gymflow` console script."""
    args = build_parser().parse_args(argv)
    logs.configure(fmt=args.log_format, level=logging.INFO if args.verbose else logging.WARNING)
    try:
        code = _dispatch(args)
        if argv is None and (args.command in {"inspect", "status"} or (args.command == "worker" and code)):
            # A short-lived client process (or a worker that could not connect) can abort in teardown
            # while the SDK's Rust threads wind down (temporalio/sdk-python#300, "PyGILState_Release
            # ... finalizing"): the output is complete, so the console script leaves without the teardown.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except (embedded.ServerError, UnknownEnvError, EnvFileError) as exc:
        print(f"gymflow: {exc}", file=sys.stderr)
        return 2
    except SettingsError as exc:
        print(f"gymflow: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "envs":
        for name in available():
            print(name)
        return 0
    if args.command == "policy":
        from workers.policy_server import serve_forever

        policy = env_class(args.env).baseline_policy(args.policy)
        print(f"serving {args.env}/{policy.name} at http://{args.host}:{args.port}/v1", file=sys.stderr)
        serve_forever(policy, host=args.host, port=args.port)
        return 0
    settings = _settings(args)
    if args.command == "codec-server":
        return _codec_server(args, settings)
    if args.command == "server":
        return _server(args, settings)
    if args.command == "deploy":
        return _deploy(args, settings)
    if args.command == "train":
        from workers.train_cli import run_train

        return run_train(args, settings)
    if args.command == "eval":
        return _eval(args, settings)
    if args.command == "dataset":
        return _dataset(args, settings)
    if args.command in {"inspect", "status"}:
        return asyncio.run(_look(args, settings))
    if args.command == "worker":
        if settings.process_count > 1:
            from workers.processes import supervise, worker_command

            command = worker_command(log_format=args.log_format, verbose=args.verbose)
            return asyncio.run(supervise(settings, command=command))
        from workers.worker import WorkerStartError, run_worker

        try:
            asyncio.run(run_worker(settings))
        except WorkerStartError as exc:
            print(f"gymflow worker: {exc}", file=sys.stderr)
            return 2
        return 0
    return _batch(args, settings)


def _server(args: argparse.Namespace, settings: Settings) -> int:
    if args.stop:
        stopped = embedded.stop_background(data_dir=settings.data_dir)
        print("server stopped" if stopped else "no background server recorded", file=sys.stderr)
        return 0
    # The server listens where the workers and clients of this config connect (--address /
    # GYMFLOW_TEMPORAL_ADDRESS) unless --port says otherwise.
    port = args.port or settings.frontend_port
    ui_port = args.ui_port or port + 1000
    if args.background:
        pid = embedded.start_background(data_dir=settings.data_dir, port=port, ui_port=ui_port)
        print(f"Temporal server started (pid {pid}) on :{port}; UI at http://localhost:{ui_port}", file=sys.stderr)
        return 0
    embedded.record(data_dir=settings.data_dir, port=port, ui_port=ui_port)
    command = embedded.dev_server_command(data_dir=settings.data_dir, port=port, ui_port=ui_port)
    print(f"Temporal server on :{port}, UI at http://localhost:{ui_port}", file=sys.stderr)
    os.execv(command[0], command)
    return 0  # pragma: no cover - execv does not return


def _codec_server(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from workers.client import encryption_codec
    from workers.codec import CodecKeyError, codec_app

    try:
        codec = encryption_codec(settings)
    except CodecKeyError as exc:
        print(f"gymflow codec-server: GYMFLOW_ENCRYPTION_KEY: {exc}", file=sys.stderr)
        return 2
    if codec is None:
        print("gymflow codec-server: set GYMFLOW_ENCRYPTION_KEY (the key the workers encrypt with)", file=sys.stderr)
        return 2
    port = settings.web_ui_port
    origins = args.origins or [f"http://localhost:{port}", f"http://127.0.0.1:{port}"]
    auth = settings.codec_auth.get_secret_value() if settings.codec_auth else None
    app = codec_app(codec, origins=origins, authorization=auth)
    login = f"; browsers log in once at http://localhost:{args.port}/login" if auth else ""
    print(
        f"codec server on http://{args.host}:{args.port} (key {codec.key_id}; origins {', '.join(origins)}; "
        f"auth {'required' if auth else 'off'}{login})",
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", log_config=None)
    return 0


def _preflight(env: str) -> None:
    """Say once, at start, what keeps `env` from running as promised here (e.g. no code sandbox)."""
    notice = env_class(env).preflight()
    if notice:
        print(f"gymflow: {notice}", file=sys.stderr)


def _batch(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runner import BatchOptions, format_table, run_batch

    _preflight(args.env)
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
        elif (settings.data_dir / "server.pid").is_file():
            note = "The Temporal server keeps running for the UI; stop it with `gymflow server --stop`."
            print(note, file=sys.stderr)
    return 0 if report.summary()["infra_failed"] == 0 else 1


def _eval(args: argparse.Namespace, settings: Settings) -> int:
    from workers.evaluate import EvalOptions, format_summary, run_eval

    _preflight(args.env)
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
    )
    summary = asyncio.run(run_eval(options, settings))
    print(json_text(summary) if args.json else format_summary(summary))
    return 0


def _dataset(args: argparse.Namespace, settings: Settings) -> int:
    from workers import datasets

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
    )  # fmt: skip
    from temporalio.client import WorkflowFailureError

    try:
        result = asyncio.run(datasets.run_generate(options, settings))
    except ValueError as exc:  # a bad --source or option
        print(f"gymflow dataset generate: {exc}", file=sys.stderr)
        return 2
    except WorkflowFailureError as exc:  # e.g. a corpus with no usable document: the cause says so
        print(f"gymflow dataset generate: {exc.cause or exc}", file=sys.stderr)
        return 1
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        splits = ", ".join(f"{k} {v}" for k, v in result.splits.items())
        print(f"{result.accepted} items ({splits}), {result.rejected} rejected: {result.uri}")
        print(f"see them with `gymflow dataset show {result.uri}`")
    return 0 if result.target_met else 1


async def _look(args: argparse.Namespace, settings: Settings) -> int:
    """`gymflow inspect` and `gymflow status`: read-only views of what the server holds."""
    from temporalio.service import RPCError

    from workers import inspect, status
    from workers.runner import connect_or_start

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


def _deploy(args: argparse.Namespace, settings: Settings) -> int:
    from deploy import launcher

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
    spec = launcher.FleetSpec(
        nodes=args.nodes,
        temporal_address=settings.temporal_address,
        task_queue=settings.task_queue,
        namespace=settings.namespace,
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


if __name__ == "__main__":
    sys.exit(main())
