"""Reference pages generated at build time (mkdocs-gen-files), never copied by hand.

- reference/configuration.md from the settings model, `gymflow.workers.config.Settings`: every
  field with its environment variable, type, default and docstring (read from the source, as
  mkdocstrings reads docstrings), so a new setting documents itself.
- reference/cli.md from the argument parser, `gymflow.workers.cli.main.build_parser`: every
  command's and subcommand's `--help`, as the installed `gymflow` prints it.
- reference/file-formats.md from the pydantic models that read env files and training run configs:
  every key with its type, default and docstring.
- assets/bench/*.png: the plots of bench/results/, which the benchmarks page shows.
- reference/api.md from `gymflow.__all__`: one mkdocstrings entry per public name, at the module
  that defines it, grouped by what it is for.

tests/test_docs.py imports this file to check what it generates; `mkdocs build` runs it.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import os
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
HELP_COLUMNS = "100"
"""argparse wraps help to the terminal's width: fixed, so the page does not depend on the builder's."""

API_SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Environments",
        "The environment contract and its wire types. These modules never import temporalio.",
        ("gymflow.envs.",),
    ),
    (
        "Rollouts",
        "Inputs and results of rollouts and groups, and the client that starts them.",
        (
            "gymflow.activities.model",
            "gymflow.activities.schema",
            "gymflow.workers.client",
            "gymflow.workers.sdk.client",
            "gymflow.workers.sdk.groups",
            "gymflow.workers.sdk.curriculum",
            "gymflow.workers.sdk.policy",
        ),
    ),
    (
        "Sessions",
        "Trainer-driven rollouts: the trainer generates, gymflow runs the tools and the reward.",
        ("gymflow.workers.sdk.sessions",),
    ),
    (
        "Evaluations, datasets and training runs",
        "The entry points behind `gymflow eval`, `gymflow dataset generate` and `gymflow train launch`.",
        ("gymflow.workers.sdk.", "gymflow.activities.training_schema", "gymflow.workers.cli."),
    ),
    ("Workers and configuration", "Running a worker in your own process, and its settings.", ("gymflow.workers.",)),
)  # fmt: skip
"""Public names are grouped by the module that defines them: the first section whose prefix matches."""


# --- configuration ------------------------------------------------------------------------------


def attribute_docstrings(cls: type) -> dict[str, str]:
    """`name: type = value` followed by a string literal, for cls and its bases (nearest wins)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass in {object, BaseModel} or klass.__module__.startswith(("pydantic", "pydantic_settings")):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        (node,) = ast.parse(source).body
        assert isinstance(node, ast.ClassDef)
        body = node.body
        for statement, following in itertools.pairwise(body):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found


def type_name(annotation: Any) -> str:
    """A field's annotation as a reader writes it: `int | None`, `Literal['auto']`, `SecretStr`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in {typing.Union, types.UnionType}:
        return " | ".join(type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if origin is not None and typing.get_args(annotation):  # list[str], dict[str, Any]
        return f"{origin.__name__}[{', '.join(type_name(arg) for arg in typing.get_args(annotation))}]"
    if annotation is Any:
        return "Any"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def constraints(field: FieldInfo) -> str:
    """Bounds pydantic enforces (`>= 1`), from the field's metadata and Annotated parts of its type."""
    metadata = list(field.metadata)
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            for extra in typing.get_args(arg)[1:]:
                metadata.extend(extra.metadata if isinstance(extra, FieldInfo) else [extra])
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = [
        f"{symbol} {getattr(item, key)}"
        for item in metadata
        for key, symbol in symbols.items()
        if getattr(item, key, None) is not None
    ]
    return ", ".join(parts)


def default_text(field: FieldInfo) -> str:
    """The default as Markdown; a factory's result when it is the same every call, else "set per process"."""
    if field.default_factory is not None:
        first, second = field.get_default(call_default_factory=True), field.get_default(call_default_factory=True)
        if isinstance(first, BaseModel):
            return "its own defaults"
        if first in ({}, []):
            return f"`{first}`"
        return f"`{first}` (computed)" if first == second else "set per process (see below)"
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "none"
    if field.default == "":
        return "empty"
    return f"`{field.default}`"


def escape_html(text: str) -> str:
    """`<` outside code spans, so `<data_dir>/results` in a docstring is shown, not parsed as a tag."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in parts)


def config_reference() -> str:
    """reference/configuration.md: every field of the settings model."""
    from gymflow.workers.config import Settings

    prefix = str(Settings.model_config.get("env_prefix", ""))
    docs = attribute_docstrings(Settings)
    lines = [
        "# Configuration",
        "",
        "<!-- generated by docs/gen_reference.py from gymflow.workers.config.Settings: edit the docstrings there -->",
        "",
        "Every gymflow process (the CLI, `gymflow worker`, `gymflow server`, the SDK's `gymflow.Settings()`)",
        f"reads one settings model from environment variables named `{prefix}<FIELD>`. Command-line options",
        "such as `--address`, `--task-queue`, `--data-dir`, `--ui-port` and `--processes` override their",
        "variable for one command. A value that is not valid stops the command with one line naming every",
        "bad variable. Secrets (API keys, encryption keys, the codec's auth value) are read by the workers",
        "and never enter workflow input or history.",
        "",
        "| variable | type | default |",
        "| --- | --- | --- |",
    ]
    details: list[str] = []
    for name, field in Settings.model_fields.items():
        variable = f"{prefix}{name}".upper()
        bounds = constraints(field)
        kind = f"`{type_name(field.annotation)}`" + (f" ({bounds})" if bounds else "")
        lines.append(f"| [`{variable}`](#{variable.lower()}) | {kind} | {default_text(field)} |")  # `|` in code is kept
        details += [
            f"### `{variable}` {{#{variable.lower()}}}",
            "",
            f"Field `{name}` · type {kind} · default {default_text(field)}",
            "",
            escape_html(docs.get(name, field.description or "(no docstring)")),
            "",
        ]
    return "\n".join([*lines, "", "## Settings", "", *details])


# --- file formats (env files, training run configs) ----------------------------------------------


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's type names (`Resources`, `list[PolicyRef] | None`, ...), once each."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = [model for arg in typing.get_args(annotation) for model in nested_models(arg)]
    return list(dict.fromkeys(found))


def model_keys(root: type[BaseModel], *, title: str, seen: set[type[BaseModel]]) -> list[str]:
    """One table per model, the root first, then every model its fields name that `seen` lacks."""
    lines: list[str] = []
    pending = [(root, title)]
    while pending:
        model, heading = pending.pop(0)
        if model in seen:
            continue
        seen.add(model)
        docs = attribute_docstrings(model)
        doc = inspect.cleandoc(model.__doc__ or "")
        lines += [f"### {heading} {{#{model.__name__.lower()}}}", "", escape_html(doc), ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            key = field.alias or name
            kind = type_name(field.annotation)
            for nested in nested_models(field.annotation):
                link = f"[{nested.__name__}](#{nested.__name__.lower()})"
                kind = re.sub(rf"\b{nested.__name__}\b", link, kind)
                pending.append((nested, f"{key}: {nested.__name__}"))
            bounds = constraints(field)
            kind = f"{kind}" + (f" ({bounds})" if bounds else "")
            text = escape_html(docs.get(name, field.description or "")).replace("\n", " ")
            cells = [f"`{key}`", kind.replace("|", "&#124;"), default_text(field), text.replace("|", "&#124;")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def formats_reference() -> str:
    """reference/file-formats.md: the keys of env files and training run configs, from their models."""
    from gymflow.activities.training_schema import RunConfig
    from gymflow.envs.envfile import EnvFile
    from gymflow.envs.mcp.config import McpServerConfig

    seen: set[type[BaseModel]] = set()
    lines = [
        "# File formats",
        "",
        "<!-- generated by docs/gen_reference.py from the pydantic models that read these files -->",
        "",
        "Every key of the YAML (or JSON) files gymflow reads, from the models that validate them. Unknown",
        "keys are errors that name the key.",
        "",
        "## Env files",
        "",
        "An environment without Python ([guide](../guides/env-files.md)). A `reward:` entry is a",
        "`module:function` or `file.py:function` string, or a reward-library entry (below).",
        "",
        *model_keys(EnvFile, title="Env file", seen=seen),
        *model_keys(McpServerConfig, title="mcpServers: one server", seen=seen),
        "## Training run configs",
        "",
        "The file `gymflow train launch CONFIG` reads ([guide](../guides/training.md)).",
        "",
        *model_keys(RunConfig, title="Run config", seen=seen),
    ]
    return "\n".join(lines)


# --- CLI ----------------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(`gymflow train launch`, its parser) for the parser and every subcommand under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subcommands(child, f"{path} {name}")


def cli_reference() -> str:
    """reference/cli.md: every command's `--help`."""
    from gymflow.workers.cli.main import build_parser

    os.environ["COLUMNS"] = HELP_COLUMNS
    os.environ["NO_COLOR"] = "1"
    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "<!-- generated by docs/gen_reference.py from gymflow.workers.cli.main.build_parser -->",
        "",
        "Every command's `--help`, as `gymflow` prints it. Options that name a setting override its",
        "`GYMFLOW_*` variable ([configuration](configuration.md)). `--json` prints one JSON document on",
        "stdout and logs only on stderr. An expected error (no server at the address, a mistyped env or",
        "policy, a bad file or setting) ends the command with one `gymflow: ...` line naming the fix and",
        "exit code 2.",
        "",
    ]
    for path, command in subcommands(parser, "gymflow"):
        level = "#" * (2 + max(0, path.count(" ") - 1))  # gymflow, gymflow train: ##; gymflow train launch: ###
        lines += [f"{level} {path}", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


# --- Python API ---------------------------------------------------------------------------------


def api_entries() -> dict[str, list[tuple[str, str]]]:
    """Section title -> (public name, dotted path where it is defined), in `__all__` order.

    A public name that is another name for one already listed (`RolloutResult` is `Trajectory`)
    keeps its own entry, whose path is its definition's.
    """
    import gymflow

    grouped: dict[str, list[tuple[str, str]]] = {title: [] for title, _, _ in API_SECTIONS}
    for name in gymflow.__all__:
        value = getattr(gymflow, name)
        module = value.__module__
        title = next(title for title, _, prefixes in API_SECTIONS if module.startswith(prefixes))
        grouped[title].append((name, f"{module}.{value.__qualname__}"))
    return grouped


def api_reference() -> str:
    """reference/api.md: the docstrings of every name in `gymflow.__all__`."""
    lines = [
        "# Python API",
        "",
        "<!-- generated by docs/gen_reference.py from gymflow.__all__ -->",
        "",
        "Everything here is importable from `gymflow` itself (`import gymflow; gymflow.Task(...)`);",
        "names resolve lazily, so `import gymflow` is cheap, and an env module that uses the contract",
        "alone never imports the Temporal SDK.",
        "",
    ]
    descriptions = {title: text for title, text, _ in API_SECTIONS}
    shown: set[str] = set()
    for title, entries in api_entries().items():
        if not entries:
            continue
        lines += [f"## {title}", "", descriptions[title], ""]
        for name, path in entries:
            if path in shown or path.rpartition(".")[2] != name:
                lines += [f"### {name}", "", f"`gymflow.{name}` is another name for [`{path}`][{path}].", ""]
                continue
            shown.add(path)
            lines += [f"::: {path}", "    options:", "      heading_level: 3", ""]
    return "\n".join(lines)


def copy_bench_plots() -> None:
    """bench/results/*.png into the site as assets/bench/*.png, for the benchmarks page."""
    import mkdocs_gen_files

    for plot in sorted((ROOT / "bench" / "results").glob("*.png")):
        with mkdocs_gen_files.open(f"assets/bench/{plot.name}", "wb") as out:
            out.write(plot.read_bytes())


def main() -> None:
    import mkdocs_gen_files

    copy_bench_plots()

    for page, text in (
        ("reference/configuration.md", config_reference()),
        ("reference/cli.md", cli_reference()),
        ("reference/api.md", api_reference()),
        ("reference/file-formats.md", formats_reference()),
    ):
        with mkdocs_gen_files.open(page, "w") as out:
            out.write(text)
        mkdocs_gen_files.set_edit_path(page, "gen_reference.py")


if __name__ in {"__main__", "<run_path>"}:
    main()
