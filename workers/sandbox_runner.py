"""The workflow sandbox, without the per-payload price the SDK's runner charges for it.

Workflow code runs in temporalio's sandbox as the SDK runs it: the workflow's module re-imported per
run, restricted modules and builtins, determinism checks. Three costs of the SDK's runner are not the
workflow code's, and a rollout paid them for every payload or run (README, Benchmarks):

* To encode or decode a payload, the SDK asks the workflow instance which serialization context the
  payload's command has (the activity, the child workflow), three passes each way. The sandboxed
  instance answers by `exec`-ing a source string with the sandbox's import hooks installed, once
  per payload per pass: ~65 µs, about as much as a turn's workflow code. The answer is a lookup in
  the SDK's own instance (pending activities and children by sequence number), which imports
  nothing, reads no clock and runs no workflow code; `FastContextRunner` reads it directly.
* Every entry into the sandbox (activations, the lookups above when they still go through it)
  compiled its source string anew; the compiled code is now kept (one per distinct string).
* Every run re-imports its workflow's module in the sandbox, and where no bytecode cache is written
  (`PYTHONDONTWRITEBYTECODE`, set by many container images and on the benchmark machine) that
  compiled the module from source each time: 1.4 ms per rollout for workflows/rollout.py. The
  module is still executed afresh per run (its state is the run's own); only its code object, which
  is immutable, is kept in memory (`ModuleCodeCache`, keyed by path, mtime and size as a .pyc is).

The first two rely on the SDK runner's internals (`_Instance`: its `globals_and_locals`, the in-sandbox
object it creates, its `_run_code`). If an SDK release moves the in-sandbox object, the runner falls
back to the SDK's own lookup and logs once; tests/workers/test_sandbox_runner.py fails on that and
on any change to the SDK's `_run_code`, so neither a silent slowdown nor a silently stale copy ships.
"""

from __future__ import annotations

import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any

import temporalio.converter
import temporalio.workflow
from temporalio.converter._extstore import StorageDriverStoreContext
from temporalio.worker import _command_aware_visitor
from temporalio.worker._workflow_instance import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import _runner as sdk_runner

log = logging.getLogger(__name__)

SDK_RUN_CODE_SHA256 = "1211e88d1ee123b6"
"""The first 16 hex digits of the SHA-256 of the SDK's `_Instance._run_code` source (dedented) that
`_Instance._run_code` here repeats with compiled code: a test fails when an SDK release changes it."""
IN_SANDBOX = "__temporal_in_sandbox"
"""The name under which the SDK's runner keeps the in-sandbox object of a run."""

_compiled: dict[str, CodeType] = {}
_compiled_lock = threading.Lock()
_warned: set[str] = set()


def _code(source: str) -> CodeType:
    code = _compiled.get(source)
    if code is None:
        code = compile(source, "workflow_sandbox.py", "exec")
        with _compiled_lock:
            _compiled[source] = code
    return code


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


def _fell_back(what: str) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning("workflow sandbox: the SDK's %s internals changed; using its slower path", what)


class _Instance(sdk_runner._Instance):
    """The SDK's sandboxed instance with compiled entry code and direct context lookups."""

    fast_lookups = 0
    """Context lookups answered directly, over every run (tests read it)."""

    def _run_code(self, code: str, **extra_globals: Any) -> None:
        # The SDK's own `_run_code`, with the entry code compiled once instead of per call.
        for key, value in extra_globals.items():
            self.globals_and_locals[key] = value
        try:
            temporalio.workflow.unsafe._set_in_sandbox(True)
            self._current_thread_id = threading.get_ident()
            exec(_code(code), self.globals_and_locals, self.globals_and_locals)
        finally:
            temporalio.workflow.unsafe._set_in_sandbox(False)
            self._current_thread_id = None
            for key in extra_globals:
                self.globals_and_locals.pop(key, None)

    def _in_sandbox(self, what: str) -> Any:
        inside = self.globals_and_locals.get(IN_SANDBOX)
        if inside is None or not hasattr(inside, what):
            _fell_back(what)
            return None
        _Instance.fast_lookups += 1
        return inside

    def get_serialization_context(
        self, command_info: _command_aware_visitor.CommandInfo | None
    ) -> temporalio.converter.SerializationContext | None:
        inside = self._in_sandbox("get_serialization_context")
        if inside is None:
            return super().get_serialization_context(command_info)
        context: temporalio.converter.SerializationContext | None = inside.get_serialization_context(command_info)
        return context

    def get_external_store_context(
        self, command_info: _command_aware_visitor.CommandInfo | None
    ) -> StorageDriverStoreContext:
        inside = self._in_sandbox("get_external_store_context")
        if inside is None:
            return super().get_external_store_context(command_info)
        context: StorageDriverStoreContext = inside.get_external_store_context(command_info)
        return context


@dataclass(frozen=True)
class FastContextRunner(SandboxedWorkflowRunner):
    """`SandboxedWorkflowRunner` with the three costs of the module docstring removed."""

    def prepare_workflow(self, defn: temporalio.workflow._Definition) -> None:
        # Once per workflow type, when a worker (or replayer) is built: its module's code is kept.
        if defn.cls.__module__ != "__main__":
            ModuleCodeCache.cover(defn.cls.__module__)
        super().prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Instance(det, self.runner_class, self.restrictions)
