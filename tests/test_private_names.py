"""No module of gymflow (or bench/) uses another module's private names.

A name with a leading underscore is its module's own business: a module that imports one (or
reaches it as `module._name`) breaks when the owner renames it, and nothing tells the owner. A
private name wanted elsewhere is made public or moved. The Temporal SDK's private modules are
fenced the same way: only gymflow.workers.sandbox_fast may import them at run time (the worker
falls back to the SDK's stock runner when that module cannot be imported), and anywhere else only
under `if TYPE_CHECKING:` (tests/workers/test_sdk_pin.py names what the fenced module relies on).

The check reads the source (ast): imports (`from X import _y`, `import X._y`, private modules in a
path) and attribute access on a name bound to a module (`launcher._alive`, `gymflow.x._y`).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"envs": "gymflow.envs", "activities": "gymflow.activities", "workflows": "gymflow.workflows",
            "workers": "gymflow.workers", "deploy": "gymflow.deploy", "bench": "bench"}  # fmt: skip
OURS = ("gymflow", "bench")
SDK = "temporalio"
FENCED = {"gymflow.workers.sandbox_fast"}
"""The modules allowed to import the SDK's private modules at run time."""


@dataclass(frozen=True)
class Use:
    module: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.what}"


def _sources() -> Iterator[tuple[str, Path]]:
    yield "gymflow", ROOT / "gymflow" / "__init__.py"
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if "out" in parts[:1] and folder == "bench":
                continue
            name = ".".join((package, *parts)).removesuffix(".__init__")
            yield name, path


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def private_uses(module: str, path: Path) -> Iterator[tuple[str, Use, bool]]:
    """(the owner's root package, the use, whether it sits under TYPE_CHECKING) of every private name reached."""
    tree = ast.parse(path.read_text())
    guarded = _type_checking_lines(tree)
    bound: dict[str, str] = {}  # local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, path.name == "__init__.py")
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if any(_private(part) for part in source.split(".")) or _private(alias.name):
                    if source != module:
                        yield (
                            source.split(".")[0],
                            Use(module, node.lineno, f"from {source} import {alias.name}"),
                            (node.lineno in guarded),
                        )
                elif source.split(".")[0] in (*OURS, SDK) and _is_module(full):
                    bound[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_private(part) for part in alias.name.split(".")):
                    yield (
                        alias.name.split(".")[0],
                        Use(module, node.lineno, f"import {alias.name}"),
                        (node.lineno in guarded),
                    )
                elif alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    bound.setdefault(root, root)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        owner = _dotted(node.value, bound)
        if owner and owner != module and owner.split(".")[0] in (*OURS, SDK):
            yield owner.split(".")[0], Use(module, node.lineno, f"{owner}.{node.attr}"), node.lineno in guarded


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The module an expression names (`launcher`, `gymflow.deploy.launcher`), or None."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        parent = _dotted(node.value, bound)
        if parent is not None and _is_module(f"{parent}.{node.attr}"):
            return f"{parent}.{node.attr}"
    return None


def test_no_module_uses_another_modules_private_names() -> None:
    found = [str(use) for module, path in _sources() for owner, use, _ in private_uses(module, path) if owner in OURS]
    assert not found, "private names of another module (make them public, or move them):\n" + "\n".join(found)


def test_sdk_internals_are_imported_only_in_the_fenced_module_or_for_type_checking() -> None:
    found = [
        str(use)
        for module, path in _sources()
        if module not in FENCED
        for owner, use, guarded in private_uses(module, path)
        if owner == SDK and not guarded
    ]
    assert not found, "temporalio internals outside gymflow.workers.sandbox_fast:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_use(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "from gymflow.deploy import launcher\n"
        "import gymflow.workers.worker\n"
        "from gymflow.activities.model import _private_helper\n"
        "from temporalio.worker import _workflow_instance\n"
        "if TYPE_CHECKING:\n"
        "    from temporalio.converter._extstore import StorageDriverStoreContext\n"
        "launcher._hidden\n"
        "gymflow.workers.worker._hidden\n"
    )
    uses = {(use.what, guarded) for _, use, guarded in private_uses("probe", probe)}
    assert uses == {
        ("from gymflow.activities.model import _private_helper", False),
        ("from temporalio.worker import _workflow_instance", False),
        ("from temporalio.converter._extstore import StorageDriverStoreContext", True),
        ("gymflow.deploy.launcher._hidden", False),
        ("gymflow.workers.worker._hidden", False),
    }
