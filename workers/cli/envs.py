"""`gymflow envs`: the envs this installation runs, as a table, and one env in detail.

* `gymflow envs` (the same as `gymflow envs list`): one row per env with its task count, scripted
  policies, tools and one-line description (gymflow.envs.catalog gathers them; every env is started at
  once to list its tools).
* `gymflow envs show NAME` (a registered name or an env file): its servers, every tool with its
  description, its dataset and what `load_dataset` takes, its policies and what makes them, its
  flags and system prompt.
* `--json` on either prints the catalog's `EnvInfo` records instead.

DESIGN reserves `install` and `remove` (env packages in venvs of their own) as further
subcommands of this parser; `list` and `show` are the read-only half.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from gymflow.envs.catalog import EnvInfo

_TOOLS_WIDTH = 40
_POLICIES_WIDTH = 40


def add_envs_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gymflow envs [list|show NAME] [--json]`."""
    p = sub.add_parser("envs", help="the envs you can run: tasks, policies, tools, description")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    esub = p.add_subparsers(dest="envs_command", metavar="{list,show}")
    lister = esub.add_parser("list", help="every env as a table (the default)")
    show = esub.add_parser("show", help="one env in detail: servers, tools, dataset, policies, prompt")
    show.add_argument("env", metavar="NAME", help="env name or env file")
    for parser in (lister, show):  # `--json` after the subcommand too; absent there, the outer value stands
        parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")


def run_envs(args: argparse.Namespace, *, out: TextIO = sys.stdout) -> int:
    """Run `gymflow envs ...`; UnknownEnvError / EnvFileError propagate to the CLI's one-line errors."""
    from gymflow.envs.catalog import describe, describe_all

    started = time.monotonic()
    if args.envs_command == "show":
        info = asyncio.run(describe(args.env))
        out.write(json.dumps(info.model_dump(mode="json"), indent=2) + "\n" if args.json else render_env(info))
        return 0
    infos = asyncio.run(describe_all())
    if args.json:
        out.write(json.dumps([i.model_dump(mode="json") for i in infos], indent=2) + "\n")
    else:
        width = shutil.get_terminal_size().columns if out.isatty() else None  # piped: descriptions whole
        out.write(render_table(infos, width=width))
        out.write(f"({len(infos)} envs in {time.monotonic() - started:.1f} s; details: gymflow envs show NAME)\n")
    return 0


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
    if info.system_prompt:
        lines += ["", "system prompt", *(f"  {line}" for line in info.system_prompt.splitlines())]
    if info.doc and info.doc != info.description:
        lines += ["", "about", *(f"  {line}" for line in info.doc.splitlines())]
    return "\n".join(lines) + "\n"
