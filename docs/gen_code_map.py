"""Writes `code-map.md`: the layers of the code, read from the import linter's contracts.

The layers and what each may import come from `[tool.importlinter]` in pyproject.toml (the rules
`lint-imports` enforces in CI), and each module's line from the first line of its docstring, so the
page cannot drift from the code: moving a module, or adding one, changes the page with it. Run by
mkdocs-gen-files on every build; `python docs/gen_code_map.py` prints the page.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "envs": "envs",
    "activities": "activities",
    "workflows": "workflows",
    "workers": "workers",
    "deploy": "deploy",
}
"""Each top-level package of gymflow and the folder it installs from (pyproject's package-dir)."""

INTRO = """\
# Code map

Where things live and which way imports go, for contributors. Users import from `gymflow` (its
`__all__`, the [API reference](reference/api.md)); this page is about the code behind it. It is
generated from the import linter's contracts in `pyproject.toml`, the rules `lint-imports` checks in
CI, and from each module's docstring, so it says what the code does.

Every import runs downhill. A layer imports only the layers below it, modules never import each
other in a circle, and something two layers share lives in the lower one. A back-arrow fails
`lint-imports` with the name of the rule it breaks:

```bash
.venv/bin/lint-imports            # every contract; a broken one lists the offending imports
```
"""

WHERE = """\
## Where to add

- **An environment**: a `BaseEnv` (or `McpEnv`) subclass. A built-in one is a folder of
  `envs/builtin/` and a line in `BUILTIN` of `envs/registry.py`; your own is registered with
  `gymflow.register` or an entry point ([Writing an environment](guides/python-env.md)). An env
  imports the contract, the env kinds (`mcp`, `harness`), runtimes and the reward library: nothing of
  activities, workflows or workers, and never temporalio.
- **A runtime** (where a rollout's tools run): a module of `envs/runtime/` implementing the interface
  of `envs/runtime/base.py`, chosen in `envs/runtime/config.py`.
- **An error type**: `envs/errors.py`, under `UserError` (the user fixes it), `InfraError` (the
  machinery failed: never a 0) or `ToolError` (the model sees it). How it crosses Temporal (its
  `ApplicationError` type) is `activities/errors.py`.
- **An activity**: a method of the class that owns the boundary's client, in the module of that
  boundary in `activities/` (a new boundary gets its own module), with an explicit name (a wire
  contract); its input and result types beside it, or in `activities/schema.py` when workflows
  share them. Register it in the role that serves it (`workers/roles.py`).
- **A workflow**: a module of `workflows/` (deterministic: no I/O, no clock, no randomness but
  Temporal's), its input and result in `activities/schema.py` or a sibling schema module, its name
  in `activities/names.py`, its role in `workers/roles.py`.
- **A CLI command**: `workers/cli/main.py` (the parser) and a function in `workers/cli/`; what a
  Python script can do too belongs in `workers/sdk/`, which the command calls.
- **A server a node runs** (policy, codec, gateway): `workers/servers/`.
"""

LAYER_JOBS = {
    "workers": "Processes and entry points: the CLI, the Python SDK, the worker process and its roles, "
    "trainers, the servers a node runs.",
    "deploy": "Launching worker fleets: SkyPilot task files and the launcher (local processes or a cluster).",
    "workflows": "Deterministic orchestration: the rollout, groups and batches, datasets, training runs, "
    "sessions. No I/O.",
    "activities": "Temporal activities, one module per external boundary, and the typed payloads, names "
    "and error types workflows and activities share.",
    "envs": "The environment contract, its wire types and errors; the env kinds (MCP, harness, env "
    "packages), runtimes, rewards, datasets and eval statistics; the built-in envs. Never imports "
    "temporalio.",
}


def contracts() -> list[dict[str, Any]]:
    """The import linter's contracts, as pyproject.toml writes them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return found


def layers_of(contract: dict[str, Any]) -> list[list[str]]:
    """A layers contract's layers, top first, each a list of its (sibling) modules."""
    return [[part.strip() for part in line.replace(":", "|").split("|")] for line in contract["layers"]]


def source_of(module: str) -> Path | None:
    """The file or package folder of `gymflow.<module>` (dotted, without `gymflow.`)."""
    top, _, rest = module.partition(".")
    base = ROOT / FOLDERS[top]
    path = base.joinpath(*rest.split(".")) if rest else base
    if path.is_dir():
        return path / "__init__.py"
    file = path.with_suffix(".py")
    return file if file.exists() else None


def summary(module: str) -> str:
    """The first sentence (its first paragraph) of a module's docstring; empty where it has none."""
    source = source_of(module)
    if source is None or not source.exists():
        return ""
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8")))
    return " ".join(doc.strip().split("\n\n")[0].split()) if doc else ""


def children(module: str) -> list[str]:
    """The direct submodules and subpackages of `gymflow.<module>` (dotted, without `gymflow.`)."""
    source = source_of(module)
    if source is None or source.name != "__init__.py":
        return []
    folder = source.parent
    names = [p.stem for p in folder.glob("*.py") if p.stem not in {"__init__", "__main__"}]
    names += [p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(f"{module}.{name}" for name in names)


def module_rows(modules: list[str]) -> list[str]:
    rows = ["| module | what it holds |", "| --- | --- |"]
    for name in modules:
        source = source_of(name)
        kind = "/" if source is not None and source.name == "__init__.py" else ""
        rows.append(f"| `{name.rpartition('.')[2]}{kind}` | {summary(name)} |")
    return rows


def page() -> str:
    by_id = {c.get("id"): c for c in contracts()}
    top = layers_of(by_id["layers"])
    lines = [INTRO, "## The layers", ""]
    lines += [
        "Top to bottom; each may import those below it and none above "
        f"(contract `{by_id['layers']['id']}`: *{by_id['layers']['name']}*).",
        "",
        "| layer | installs as | its job | may import |",
        "| --- | --- | --- | --- |",
    ]
    for index, layer in enumerate(top):
        below = [name for lower in top[index + 1 :] for name in lower]
        for name in layer:
            may = ", ".join(f"`{b}`" for b in below) or "nothing of gymflow's"
            lines.append(f"| `{FOLDERS[name]}/` | `gymflow.{name}` | {LAYER_JOBS[name]} | {may} |")
    lines.append("")
    inner = {
        c["containers"][0].removeprefix("gymflow."): c
        for c in contracts()
        if c["type"] == "layers" and c.get("containers") != ["gymflow"]
    }
    for name in (n for layer in top for n in layer):
        lines += [f"## `gymflow.{name}`", "", summary(name), ""]
        contract = inner.get(name)
        if contract is None:
            lines += [*module_rows(children(name)), ""]
            continue
        lines += [
            f"Its own layers, top to bottom (contract `{contract['id']}`: *{contract['name']}*); "
            "modules in one row may be imported by the rows above.",
            "",
            "| layer | modules |",
            "| --- | --- |",
        ]
        for depth, layer in enumerate(layers_of(contract), start=1):
            cells = "; ".join(f"`{m}` ({summary(f'{name}.{m}') or '—'})" for m in layer)
            lines.append(f"| {depth} | {cells} |")
        lines.append("")
    lines += [WHERE, "## Every rule", "", "| id | rule | kind |", "| --- | --- | --- |"]
    lines += [f"| `{c['id']}` | {c['name']} | {c['type']} |" for c in contracts()]
    return "\n".join(lines) + "\n"


def check_paths(text: str) -> None:
    """Every file or folder the prose names (`envs/registry.py`, `workers/cli/`) exists, so a move fails
    the docs build instead of leaving the page wrong."""
    missing = [
        p
        for p in re.findall(r"`((?:envs|activities|workflows|workers|deploy)/[\w/.]*)`", text)
        if not (ROOT / p).exists()
    ]
    if missing:
        raise SystemExit(f"docs/gen_code_map.py names paths that do not exist: {', '.join(missing)}")


def main() -> None:
    import mkdocs_gen_files

    check_paths(WHERE)
    with mkdocs_gen_files.open("code-map.md", "w") as out:
        out.write(page())


if __name__ == "__main__":
    check_paths(WHERE)
    print(page())
else:  # mkdocs-gen-files runs it
    main()
