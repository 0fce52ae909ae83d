"""User code named in config: `module:function` (importable) or `path/to/file.py:function`.

A config-only env ships its reward and parsers as plain Python files next to its config
(benchmax's reward_fn.py), so a `.py` path is loaded from the file, relative to the config's
directory; anything else is imported as a module. A bad spec is a ValueError naming it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_callable(spec: str, *, base_dir: Path | None = None, field: str = "callable") -> Callable[..., Any]:
    """The function `spec` names.

    Args:
        spec: `module:function` or `file.py:function` (a relative file is taken from `base_dir`).
        base_dir: Directory that relative `.py` paths are relative to (the config's directory).
        field: The config field being loaded, for error messages.

    Raises:
        ValueError: The spec is malformed, the module or file cannot be loaded, or the name is
            missing or not callable; the message names `field`.
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise ValueError(f"{field}: expected 'module:function' or 'file.py:function', got {spec!r}")
    try:
        module = _load_file(Path(target), base_dir) if target.endswith(".py") else importlib.import_module(target)
    except (ImportError, OSError, SyntaxError) as exc:
        raise ValueError(f"{field}: cannot load {target!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{field}: {target!r} has no function {attr!r}")  # noqa: TRY004 - a config error
    return fn


def _load_file(path: Path, base_dir: Path | None) -> Any:
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    path = path.resolve()
    if not path.is_file():
        raise ImportError(f"no such file {path}")
    # One module per file path, so two envs with a reward_fn.py each never overwrite each other.
    name = f"gymflow_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
