"""The `gymflow` command line. Names here are stable: other tools and docs rely on them."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gymflow.envs.errors import SettingsError
from gymflow.envs.registry import env_class
from gymflow.workers import logs
from gymflow.workers.cli import commands, exits
from gymflow.workers.cli.envs import add_envs_args, run_envs
from gymflow.workers.config import ROLES, Settings
from gymflow.workers.connection import ConnectionOptions


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        key: value
        for key, value in {
            "task_queue": getattr(args, "task_queue", None),
            "data_dir": getattr(args, "data_dir", None),
            "ui_port": getattr(args, "ui_port", None),
            "worker_processes": getattr(args, "processes", None),
            "metrics_port": getattr(args, "metrics_port", None),
            "worker_roles": getattr(args, "roles", None),
        }.items()
        if value is not None
    }
    # The connection flags, over GYMFLOW_* and TEMPORAL_* variables and profiles (gymflow.workers.connection).
    overrides["connection"] = ConnectionOptions(
        **{name: getattr(args, name, None) for name in ConnectionOptions.__dataclass_fields__}
    )
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(f"invalid setting (a GYMFLOW_* variable or its option): {_problems(exc)}") from None


def _problems(exc: ValidationError) -> str:
    """`GYMFLOW_NAME='value': why` per setting (a union's branches joined by `or`; a secret's value never shown)."""
    found: dict[str, list[str]] = {}
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "?"
        field = Settings.model_fields.get(name)
        secret = field is not None and "SecretStr" in str(field.annotation)
        shown = "" if secret else f"={error['input']!r}"
        found.setdefault(f"GYMFLOW_{name.upper()}{shown}", []).append(error["msg"])
    return "; ".join(f"{setting}: {' or '.join(messages)}" for setting, messages in found.items())


def _processes(text: str) -> int | str:
    from gymflow.workers.processes import parse_processes

    try:
        return parse_processes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--processes ")) from exc


def _worker_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run a worker serving its roles (default: all) on their queues")
    _common(p)
    p.add_argument(
        "--processes",
        type=_processes,
        help="worker processes on this node: N or `auto` (one per core); default 1 (GYMFLOW_WORKER_PROCESSES)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics at :PORT/metrics (GYMFLOW_METRICS_PORT; process i of --processes: PORT+i)",
    )
    p.add_argument(
        "--roles",
        help=f"roles to serve, comma-separated, of {','.join(ROLES)}; default all (GYMFLOW_WORKER_ROLES)",
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
    _connection_args(parser)
    parser.add_argument("--task-queue", help="shared task queue (GYMFLOW_TASK_QUEUE)")
    parser.add_argument("--data-dir", type=Path, help="server data directory (GYMFLOW_DATA_DIR)")
    parser.add_argument(
        "--ui-port",
        type=int,
        help="Web UI port (GYMFLOW_UI_PORT; default: what `gymflow server` recorded, else port + 1000)",
    )


def _connection_args(parser: argparse.ArgumentParser) -> None:
    """The `temporal` CLI's connection flags; each beats its variable and the profile (docs/guides/cluster.md)."""
    g = parser.add_argument_group(
        "Temporal connection",
        "flags over GYMFLOW_TEMPORAL_ADDRESS / GYMFLOW_NAMESPACE, over TEMPORAL_* variables and the temporal.toml "
        "profile, over localhost:7233",
    )
    g.add_argument("--address", help="frontend host:port (GYMFLOW_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS)")
    g.add_argument("--namespace", help="namespace (GYMFLOW_NAMESPACE, TEMPORAL_NAMESPACE)")
    g.add_argument("--profile", help="temporal.toml profile (TEMPORAL_PROFILE; default: default)")
    g.add_argument("--config-file", type=Path, help="temporal.toml path (TEMPORAL_CONFIG_FILE)")
    g.add_argument("--api-key", help="API key, sent over TLS (TEMPORAL_API_KEY; prefer the variable or a profile)")
    g.add_argument("--tls", action="store_true", default=None, help="use TLS (TEMPORAL_TLS; implied by the others)")
    g.add_argument("--tls-ca-path", type=Path, help="server CA certificate (TEMPORAL_TLS_SERVER_CA_CERT_PATH)")
    g.add_argument("--tls-cert-path", type=Path, help="client certificate for mTLS (TEMPORAL_TLS_CLIENT_CERT_PATH)")
    g.add_argument("--tls-key-path", type=Path, help="client private key for mTLS (TEMPORAL_TLS_CLIENT_KEY_PATH)")
    g.add_argument("--tls-server-name", help="TLS server name to verify (TEMPORAL_TLS_SERVER_NAME)")


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
            d.add_argument(
                "--roles", help=f"roles every node serves, of {','.join(ROLES)}; default all (GYMFLOW_WORKER_ROLES)"
            )
            d.add_argument("--dryrun", action="store_true", help="print the task, launch nothing")


def _eval_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow eval ENV` and `gymflow eval rescore BATCH --reward SPEC`."""
    p = sub.add_parser(
        "eval",
        help="evaluate a policy (vs a baseline) with bootstrap confidence intervals, or rescore a batch",
        description="`gymflow eval ENV`: evaluate a policy; `gymflow eval rescore BATCH --reward SPEC`: score a "
        "finished batch's stored trajectories again with another reward, as a new batch (no model call).",
    )
    _common(p)
    p.add_argument("env", help="env name, or `rescore` (then BATCH and --reward)")
    p.add_argument("batch", nargs="?", metavar="BATCH", help="with `rescore`: the finished batch to rescore")
    p.add_argument(
        "--reward",
        metavar="SPEC",
        help="with `rescore`: file.py:fn, module:fn, '{fn: NAME, extract: RULE}' (the reward library) or an env name",
    )
    p.add_argument(
        "--resume",
        metavar="BATCH",
        help="run only the rollouts of BATCH (this env's) that are missing or infra-failed; report the merged result",
    )
    p.add_argument("--policy", default="default", help="an OpenAI-compatible URL (…/v1) or a baseline policy name")
    p.add_argument("--baseline", help="a second policy to compare against (URL or baseline name)")
    p.add_argument("--n", type=int, help="number of tasks (default 32; harbor: every task of --dataset)")
    p.add_argument("--samples", type=int, default=1, help="samples per task (for pass@k)")
    p.add_argument(
        "--dataset",
        default="generated",
        help="`generated`, a dataset path or URI (search: a dataset URI; harbor: a directory of task directories)",
    )
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
    from gymflow.envs.datagen.filters import FILTERS

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
    g.add_argument(
        "--skip-filter", action="append", choices=sorted(FILTERS), metavar="NAME",
        help="do not apply this filter (repeatable): " + "; ".join(f"{k}: {v}" for k, v in FILTERS.items()),
    )  # fmt: skip
    g.add_argument("--no-worker", action="store_true", help="rely on running workers instead of an in-process one")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    s = dsub.add_parser("show", help="counts, rejections by reason and samples of a dataset")
    s.add_argument("uri", help="dataset directory or URI")
    s.add_argument("--samples", type=int, default=3)
    s.add_argument("--json", action="store_true")


def _train_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow train launch|list|status|logs|cancel` (gymflow.workers.cli.train)."""
    from gymflow.workers.cli.train import add_train_args

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
    p.add_argument(
        "action",
        nargs="?",
        choices=["setup"],
        help="setup: register gymflow's search attributes on the configured cluster (one you operate)",
    )
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

    _eval_args(sub)

    p = sub.add_parser("policy", help="baseline policies")
    psub = p.add_subparsers(dest="policy_command", required=True)
    serve = psub.add_parser("serve", help="serve an env's scripted policy as an OpenAI-compatible endpoint")
    serve.add_argument("env", help="env name or env file")
    serve.add_argument("--policy", default="default", help="policy name (`gymflow envs show ENV`; default: the first)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)

    _look_args(sub)
    _codec_server_args(sub)
    _deploy_args(sub)
    _dataset_args(sub)
    _train_args(sub)
    add_envs_args(sub)
    _log_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gymflow` console script (`argv` None); tests pass `argv` and get the code.

    Every command ends through gymflow.workers.cli.exits: an expected error is one `gymflow:` line and exit 2,
    and the console script leaves without the interpreter teardown the Temporal SDK can abort in.
    """
    args = build_parser().parse_args(argv)
    logs.configure(fmt=args.log_format, level=logging.INFO if args.verbose else logging.WARNING)
    code = exits.run(lambda: _dispatch(args))
    from gymflow.workers import tracing

    tracing.flush()  # spans still batched: the console script leaves without interpreter teardown
    if argv is None:
        exits.leave(code)
    return code


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "envs":
        return run_envs(args)
    if args.command == "policy":
        from gymflow.workers.servers.policy import serve_forever

        policy = env_class(args.env).baseline_policy(args.policy)  # UnknownPolicy / NoBaselinePolicy: UserErrors
        print(f"serving {args.env}/{policy.name} at http://{args.host}:{args.port}/v1", file=sys.stderr)
        serve_forever(policy, host=args.host, port=args.port)
        return 0
    settings = _settings(args)
    # Env packages are found by this variable in every process of the node (gymflow.envs.packages.store):
    # this one, its worker, the policy servers it starts.
    packages = settings.env_packages_dir or settings.data_dir / "env-packages"
    os.environ.setdefault("GYMFLOW_ENV_PACKAGES_DIR", str(packages.resolve()))
    if args.command == "codec-server":
        return commands.codec_server(args, settings)
    if args.command == "server":
        return commands.server(args, settings)
    if args.command == "deploy":
        return commands.deploy(args, settings)
    if args.command == "train":
        from gymflow.workers.cli.train import run_train

        return run_train(args, settings)
    if args.command == "eval":
        return commands.evaluate(args, settings)
    if args.command == "dataset":
        return commands.dataset(args, settings)
    if args.command in {"inspect", "status"}:
        return asyncio.run(commands.look(args, settings))
    if args.command == "worker":
        if settings.process_count > 1:
            from gymflow.workers.processes import supervise, worker_command

            command = worker_command(log_format=args.log_format, verbose=args.verbose)
            return asyncio.run(supervise(settings, command=command))
        from gymflow.workers.worker import run_worker

        asyncio.run(run_worker(settings))
        return 0
    return commands.batch(args, settings)


if __name__ == "__main__":
    sys.exit(main())
