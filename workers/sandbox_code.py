"""The compiled code of the workflow modules the sandbox re-imports for every run, kept in memory.

The sandbox re-imports a workflow's module per run; with `PYTHONDONTWRITEBYTECODE=1` (many images)
it would compile the source every time. `ModuleCodeCache`, a meta path finder, serves the code
object compiled once per file version (keyed by path, mtime and size, as a .pyc is); the module
still runs afresh per run. gymflow.workers.sandbox_fast installs it for the modules it prepares.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import threading
from collections.abc import Sequence
from types import CodeType

_compiled_lock = threading.Lock()


class _CachedSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader whose compiled code is kept in memory between imports of the same file."""

    def get_code(self, fullname: str) -> CodeType:
        stat = os.stat(self.path)
        key = (self.path, stat.st_mtime_ns, stat.st_size)
        code = ModuleCodeCache.codes.get(key)
        if code is None:
            code = super().get_code(fullname)
            assert code is not None  # a source file always has code
            with _compiled_lock:
                ModuleCodeCache.codes[key] = code
        else:
            ModuleCodeCache.hits += 1
        return code


class ModuleCodeCache:
    """A meta path finder for the workflow modules the sandbox re-imports per run: their specs come
    from the normal path finder, with a loader that keeps the compiled code (one per file version)."""

    modules: set[str] = set()
    codes: dict[tuple[str, int, int], CodeType] = {}
    hits = 0
    """Imports served from memory, over every run (tests read it)."""

    @classmethod
    def cover(cls, module: str) -> None:
        """Serve `module`'s code from memory from now on (installs the finder once)."""
        with _compiled_lock:
            cls.modules.add(module)
            if cls not in sys.meta_path:
                sys.meta_path.insert(0, cls)  # a class-level finder

    @classmethod
    def find_spec(
        cls, fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in cls.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader or not spec.origin:
            return spec
        spec.loader = _CachedSourceLoader(fullname, spec.origin)
        return spec
