"""`gymflow envs`: the envs this installation runs, as a table, one env in detail, env packages.

* `gymflow envs` (the same as `gymflow envs list`): one row per env with its task count, scripted
  policies, tools and one-line description (gymflow.envs.catalog gathers them; every env is started at
  once to list its tools, except env packages, whose install recorded them). `--packages`: the
  installed env packages instead (name, version, digest, source, envs).
* `gymflow envs show NAME` (a registered name, an env file or an env package's `NAME[@VERSION]`): its
  servers, every tool with its description, its dataset and what `load_dataset` takes, its policies
  and what makes them, its flags and system prompt.
* `gymflow envs install SPEC` / `remove NAME [VERSION]`: env packages in venvs of their own
  (gymflow.envs.packages.install); `--root DIR` (or GYMFLOW_ENV_PACKAGES_DIR) says where they live.
* `gymflow envs serve NAME`: the env over OpenEnv's protocol, each OpenEnv session a durable gymflow
  session (gymflow.workers.sdk.openenv).
* `--json` on list and show prints the catalog's `EnvInfo` records instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from gymflow.envs.catalog import EnvInfo
    from gymflow.envs.packages.store import PackageRecord

_TOOLS_WIDTH = 40
_POLICIES_WIDTH = 40


def add_envs_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow envs [list|show NAME|install SPEC|remove NAME|serve NAME] [--json]`."""
    p = sub.add_parser("envs", help="the envs you can run: tasks, policies, tools, description; env packages")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--root", help="where env packages live (GYMFLOW_ENV_PACKAGES_DIR; default <data dir>/env-packages)")
    esub = p.add_subparsers(dest="envs_command", metavar="{list,show,install,remove,serve}")
    lister = esub.add_parser("list", help="every env as a table (the default)")
    lister.add_argument("--packages", action="store_true", help="the installed env packages instead")
    show = esub.add_parser("show", help="one env in detail: servers, tools, dataset, policies, prompt")
    show.add_argument("env", metavar="NAME", help="env name, NAME@VERSION of an env package, or env file")
    for parser in (lister, show):  # `--json` after the subcommand too; absent there, the outer value stands
        parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    install = esub.add_parser("install", help="install an env package into a venv of its own")
    install.add_argument(
        "spec",
        metavar="SPEC",
        help="a PyPI requirement (name==version), a wheel, a git URL, a directory, or a training bundle's "
        "env_packages/NAME-VERSION",
    )
    install.add_argument("--with", dest="extras", action="append", default=[], metavar="REQ",
                         help="a further requirement in its venv (repeatable)")  # fmt: skip
    install.add_argument("--env", dest="envs", action="append", default=[], metavar="NAME=TARGET",
                         help="an env the package does not declare itself: NAME=module:Class (repeatable)")  # fmt: skip
    install.add_argument("--option", dest="options", action="append", default=[], metavar="[ENV:]KEY=VALUE",
                         help="a keyword argument its envs are built with (VALUE as JSON, else text)")  # fmt: skip
    install.add_argument("--dataset", dest="datasets", action="append", default=[], metavar="[ENV=]NAME",
                         help="the dataset `gymflow eval` runs by default (the env's loader's name)")  # fmt: skip
    install.add_argument("--dataset-option", dest="dataset_options", action="append", default=[],
                         metavar="[ENV:]KEY=VALUE", help="an option of its loader (repeatable)")  # fmt: skip
    install.add_argument("--policy", dest="policies", action="append", default=[], metavar="[ENV:]NAME=SPEC",
                         help="a scripted policy, NAME=module:Class or file.py:Class (repeatable)")  # fmt: skip
    install.add_argument("--stateless", action="append", nargs="?", const="", default=[], metavar="ENV",
                         help="its envs (or ENV) keep no state a lost rollout needs (repeatable)")  # fmt: skip
    install.add_argument("--python", help="interpreter to make the venv from (default: gymflow's)")
    remove = esub.add_parser("remove", help="delete an env package (every version, or one)")
    remove.add_argument("package", metavar="NAME", help="the package's distribution name (see `envs list --packages`)")
    remove.add_argument("version", nargs="?", help="only this version")
    serve = esub.add_parser("serve", help="serve an env over OpenEnv's protocol (reset / step / state)")
    serve.add_argument("env", metavar="NAME", help="env name (see `gymflow envs`)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--dataset", default="generated", help="where reset's task comes from (default: the env's own)")
    serve.add_argument("--address", help="Temporal frontend host:port (GYMFLOW_TEMPORAL_ADDRESS)")
    serve.add_argument("--task-queue", help="the workers' task queue (GYMFLOW_TASK_QUEUE)")


def _pairs(values: list[str], flag: str, *, parse: bool) -> dict[str, Any]:
    from gymflow.envs.errors import PackageError

    found: dict[str, Any] = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise PackageError(f"{flag} takes KEY=VALUE, got {value!r}")
        if parse:
            try:
                found[key] = json.loads(text)
            except ValueError:
                found[key] = text
        else:
            found[key] = text
    return found


def run_envs(args: argparse.Namespace, *, out: TextIO = sys.stdout) -> int:
    """Run `gymflow envs ...`; UnknownEnvError / EnvFileError / PackageError propagate to the CLI's one-line errors."""
    from gymflow.envs.catalog import describe, describe_all

    if args.root:
        from gymflow.envs.packages.store import ROOT_VARIABLE

        os.environ[ROOT_VARIABLE] = os.path.abspath(args.root)  # this process and what it starts
    started = time.monotonic()
    if args.envs_command == "install":
        return _install(args, out)
    if args.envs_command == "remove":
        from gymflow.envs.packages import store

        for record in store.remove(args.package, args.version):
            out.write(f"removed {record.name} {record.version} ({record.directory})\n")
        return 0
    if args.envs_command == "serve":
        from gymflow.workers.sdk.openenv import serve_from_cli

        return serve_from_cli(args)
    if args.envs_command == "show":
        info = asyncio.run(describe(args.env))
        out.write(json.dumps(info.model_dump(mode="json"), indent=2) + "\n" if args.json else render_env(info))
        return 0
    if getattr(args, "packages", False):
        from gymflow.envs.packages import store

        records = store.records()
        if args.json:
            out.write(json.dumps([r.model_dump(mode="json") for r in records], indent=2) + "\n")
        else:
            out.write(render_packages(records))
        return 0
    infos = asyncio.run(describe_all())
    if args.json:
        out.write(json.dumps([i.model_dump(mode="json") for i in infos], indent=2) + "\n")
    else:
        width = shutil.get_terminal_size().columns if out.isatty() else None  # piped: descriptions whole
        out.write(render_table(infos, width=width))
        out.write(f"({len(infos)} envs in {time.monotonic() - started:.1f} s; details: gymflow envs show NAME)\n")
    return 0


def _install(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    from gymflow.envs.packages.install import install_bundled, is_bundled

    say = lambda line: print(line, file=sys.stderr)  # noqa: E731 - progress goes to stderr
    if is_bundled(args.spec):  # a bundle's env_packages/<name>-<version>: exactly that again
        record = install_bundled(Path(args.spec), python=args.python, say=say)
    else:
        record = _install_spec(args, say)
    out.write(f"installed {record.name} {record.version} (digest {record.digest[:12]}) in {record.directory}\n")
    for decl in record.envs:
        tasks = "-" if decl.tasks is None else str(decl.tasks)
        tools = ", ".join(t.name for t in decl.tools) or "no tools"
        out.write(f"  env {decl.name}: {decl.kind}, {tasks} tasks, {tools}\n")
    return 0


def _install_spec(args: argparse.Namespace, say: Any) -> PackageRecord:
    from gymflow.envs.packages.install import install

    return install(
        args.spec,
        extras=args.extras,
        envs=_pairs(args.envs, "--env", parse=False),
        options=_pairs(args.options, "--option", parse=True),
        datasets={k if sep else "": v for k, sep, v in (d.rpartition("=") for d in args.datasets)},
        dataset_options=_pairs(args.dataset_options, "--dataset-option", parse=True),
        policies=_pairs(args.policies, "--policy", parse=False),
        stateless=True if "" in args.stateless else args.stateless,
        python=args.python,
        say=say,
    )


def render_packages(records: list[PackageRecord]) -> str:
    """The `gymflow envs list --packages` table."""
    rows = [("PACKAGE", "VERSION", "DIGEST", "SOURCE", "ENVS")]
    rows += [
        (
            r.name,
            r.version,
            r.digest[:12],
            r.source if r.source == "pypi" else f"{r.source} {r.spec}",
            ", ".join(d.name for d in r.envs),
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join([*(row[i].ljust(widths[i]) for i in range(4)), row[4]]).rstrip() for row in rows]
    return "\n".join(lines) + "\n" + ("" if records else "(no env packages installed: gymflow envs install SPEC)\n")


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _policies(info: EnvInfo) -> str:
    return ", ".join("=".join(p.names) for p in info.policies)


def _tools(info: EnvInfo) -> str:
    if info.tools is None:
        return "? (see envs show)" if info.tools_error else "-"
    return f"{len(info.tools)}: " + ", ".join(t.name for t in info.tools)


def render_table(infos: list[EnvInfo], *, width: int | None = None) -> str:
    """The `gymflow envs` table: env, tasks, policies (the first is the default; `a=b`: one policy
    under two names), tools, description (cut to `width`, the terminal's, if given)."""
    rows: list[tuple[str, ...]] = []
    for info in infos:
        if info.error is not None:
            rows.append((info.name, "-", "-", "-", f"cannot load: {info.error}"))
            continue
        tasks = "-" if info.tasks is None else str(info.tasks)
        policies, tools = _cut(_policies(info), _POLICIES_WIDTH), _cut(_tools(info), _TOOLS_WIDTH)
        rows.append((info.name, tasks, policies, tools, info.description))
    header = ("ENV", "TASKS", "POLICIES", "TOOLS", "DESCRIPTION")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    used = sum(widths) + 2 * 4
    lines = []
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2].ljust(widths[2]), row[3].ljust(widths[3])]
        description = row[4] if width is None else _cut(row[4], max(width - used, 30))
        lines.append("  ".join([*cells, description]).rstrip())
    return "\n".join(lines) + "\n"


def _signature(schema: dict[str, Any]) -> str:
    properties = schema.get("properties")
    return ", ".join(properties) if isinstance(properties, dict) else ""


def render_env(info: EnvInfo) -> str:
    """The `gymflow envs show NAME` view."""
    lines = [f"{info.name}: {info.description}" if info.description else info.name]
    lines.append(f"  {info.target} ({info.source})" + (f" · {', '.join(info.flags)}" if info.flags else ""))
    if info.error is not None:
        return "\n".join([*lines, f"  cannot load: {info.error}"]) + "\n"
    if info.servers:
        lines += ["", "servers"]
        width = max(len(name) for name in info.servers)
        lines += [f"  {name.ljust(width)}  {how}" for name, how in info.servers.items()]
    lines += ["", f"tools ({len(info.tools)})" if info.tools is not None else "tools"]
    if info.tools_error is not None:
        first, *rest = info.tools_error.splitlines() or [""]
        lines += [f"  could not list them: {first}", *(f"  {line}" for line in rest)]
    elif info.tools is not None:
        calls = [f"{t.name}({_signature(t.input_schema)})" if not info.tools_declared else t.name for t in info.tools]
        width = max((len(c) for c in calls), default=0)
        for call, tool in zip(calls, info.tools, strict=True):
            lines.append(f"  {call.ljust(width)}  {_cut(tool.description, 100)}".rstrip())
        if info.tools_declared:
            lines.append("  (declared by allowed_tools; start a rollout to see their descriptions)")
    tasks = f"{info.tasks} tasks" if info.tasks is not None else f"none ({info.dataset_error})"
    lines += ["", "dataset", f"  {info.dataset}: {tasks}"]
    if info.dataset_doc:
        lines += [f"  {line}" for line in info.dataset_doc.splitlines()]
    lines += ["", f"policies (--policy NAME, `gymflow policy serve {info.name} --policy NAME`)"]
    width = max(len(", ".join(p.names)) for p in info.policies)
    for policy in info.policies:
        names = ", ".join(policy.names).ljust(width)
        lines.append(f"  {names}  {policy.target}" + ("  (default)" if policy.default else ""))
    if not any(p.default for p in info.policies):
        lines.append("  no scripted policy: play it with a model (--model-url URL)")
    if info.node:
        lines += ["", "this node", *(f"  {line}" for line in info.node)]
    if info.system_prompt:
        lines += ["", "system prompt", *(f"  {line}" for line in info.system_prompt.splitlines())]
    if info.doc and info.doc != info.description:
        lines += ["", "about", *(f"  {line}" for line in info.doc.splitlines())]
    return "\n".join(lines) + "\n"
