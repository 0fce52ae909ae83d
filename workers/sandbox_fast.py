"""gymflow's fast workflow runner: the SDK's sandbox without its per-payload entries into it.

The only module of gymflow that imports the Temporal SDK's private modules at run time. It is
imported lazily by `gymflow.workers.sandbox_runner.workflow_runner`, which falls back to the SDK's
stock `SandboxedWorkflowRunner` (and logs why, once) when importing it fails or `check()` finds the
SDK changed under it. `SDK_INTERNALS` names every private name used here, and
tests/workers/test_sdk_pin.py asserts that the pinned SDK still has each of them.

Workflow code runs in temporalio's sandbox as the SDK runs it: the workflow's module re-imported per
run, restricted modules and builtins, determinism checks. Three costs of the SDK's runner are not the
workflow code's, and a rollout paid them for every payload or run:

* To encode or decode a payload, the SDK asks the workflow instance which serialization context the
  payload's command has (the activity, the child workflow), three passes each way. The sandboxed
  instance answers by `exec`-ing a source string with the sandbox's import hooks installed, once
  per payload per pass. The answer is a lookup in the SDK's own instance (pending activities and
  children by sequence number), which imports nothing, reads no clock and runs no workflow code;
  `FastInstance` reads it directly.
* Every entry into the sandbox (activations, the lookups above when they still go through it)
  compiled its source string anew; the compiled code is now kept (one per distinct string).
* Every run re-imports its workflow's module in the sandbox, and where no bytecode cache is written
  (`PYTHONDONTWRITEBYTECODE`, set by many container images) that compiled the module from source
  each time. The module is still executed afresh per run (its state is the run's own); only its
  code object, which is immutable, is kept in memory (`ModuleCodeCache`, keyed by path, mtime and
  size as a .pyc is).

The first two rely on the SDK runner's internals (`_Instance`: its `globals_and_locals`, the in-sandbox
object it creates, its `_run_code`). If an SDK release moves the in-sandbox object, the lookups fall
back to the SDK's own and log once; if it changes `_run_code`, `check()` sends the worker to the stock
runner, so a silently stale copy never runs.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import textwrap
import threading
from dataclasses import dataclass
from types import CodeType
from typing import TYPE_CHECKING, Any

import temporalio.converter
import temporalio.workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import _runner as sdk_runner

from gymflow.workers.sandbox_code import ModuleCodeCache

if TYPE_CHECKING:
    from temporalio.converter._extstore import StorageDriverStoreContext
    from temporalio.worker._command_aware_visitor import CommandInfo
    from temporalio.worker._workflow_instance import WorkflowInstance, WorkflowInstanceDetails

log = logging.getLogger(__name__)

SDK_INTERNALS = (
    "temporalio.worker.workflow_sandbox._runner._Instance",
    "temporalio.worker.workflow_sandbox._runner._Instance._run_code",
    "temporalio.worker.workflow_sandbox._runner._Instance.get_serialization_context",
    "temporalio.worker.workflow_sandbox._runner._Instance.get_external_store_context",
    "temporalio.workflow.unsafe._set_in_sandbox",
    "temporalio.converter._extstore.StorageDriverStoreContext",
    "temporalio.worker._command_aware_visitor.CommandInfo",
    "temporalio.worker._workflow_instance.WorkflowInstance",
    "temporalio.worker._workflow_instance.WorkflowInstanceDetails",
    "temporalio.workflow._Definition",
)
"""Every private SDK name this module relies on (the last four for type annotations only)."""
SDK_INSTANCE_ATTRIBUTES = ("globals_and_locals", "_current_thread_id")
"""Attributes a `_Instance` object sets in its constructor that `FastInstance._run_code` uses."""
SDK_RUN_CODE_SHA256 = "1211e88d1ee123b6"
"""The first 16 hex digits of the SHA-256 of the SDK's `_Instance._run_code` source (dedented) that
`FastInstance._run_code` repeats with compiled code: `check()` refuses an SDK whose copy differs."""
IN_SANDBOX = "__temporal_in_sandbox"
"""The name under which the SDK's runner keeps the in-sandbox object of a run."""

_compiled: dict[str, CodeType] = {}
_compiled_lock = threading.Lock()
_warned: set[str] = set()


def check() -> str | None:
    """Why this runner must not run on the installed SDK (its `_run_code` changed), or None."""
    try:
        source = textwrap.dedent(inspect.getsource(sdk_runner._Instance._run_code))
    except (OSError, TypeError):  # no source shipped: the pin test vouches for the installed version
        return None
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest != SDK_RUN_CODE_SHA256:
        return f"the SDK's _Instance._run_code changed (sha256 {digest}, written against {SDK_RUN_CODE_SHA256})"
    return None


def _code(source: str) -> CodeType:
    code = _compiled.get(source)
    if code is None:
        code = compile(source, "workflow_sandbox.py", "exec")
        with _compiled_lock:
            _compiled[source] = code
    return code


def _fell_back(what: str) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning("workflow sandbox: the SDK's %s internals changed; using its slower path", what)


class FastInstance(sdk_runner._Instance):
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
        FastInstance.fast_lookups += 1
        return inside

    def get_serialization_context(
        self, command_info: CommandInfo | None
    ) -> temporalio.converter.SerializationContext | None:
        inside = self._in_sandbox("get_serialization_context")
        if inside is None:
            return super().get_serialization_context(command_info)
        context: temporalio.converter.SerializationContext | None = inside.get_serialization_context(command_info)
        return context

    def get_external_store_context(self, command_info: CommandInfo | None) -> StorageDriverStoreContext:
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
        return FastInstance(det, self.runner_class, self.restrictions)
