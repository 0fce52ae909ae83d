"""The workflow sandbox: what passes through it, and which runner runs it.

Workflow code always runs in temporalio's sandbox. Two runners offer it (`GYMFLOW_WORKFLOW_RUNNER`):

* ``fast`` (the default): `gymflow.workers.sandbox_fast.FastContextRunner`, the SDK's runner without
  its per-payload entries into the sandbox and without recompiling workflow modules per run. It
  subclasses the SDK runner's private internals, so it lives in a module of its own, imported only
  here and only when chosen. If that import fails (an SDK release renamed what it uses) or the SDK
  changed the code it repeats, `workflow_runner` logs why, once, and returns the stock runner: a
  worker always starts.
* ``stock``: the SDK's own `SandboxedWorkflowRunner`, with the same restrictions and passthrough
  modules. Chosen explicitly, or the fallback above.

Both run the same workflow code under the same restrictions, so recorded histories replay under
either (tests/workflows/test_replay.py replays every one under both).
"""

from __future__ import annotations

import functools
import logging
from typing import Literal

from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

log = logging.getLogger(__name__)

RunnerChoice = Literal["fast", "stock"]
"""`fast`: gymflow's runner (gymflow.workers.sandbox_fast); `stock`: the SDK's `SandboxedWorkflowRunner`."""

# Modules the workflow sandbox shares with the host instead of re-importing per run: pydantic and
# the wire types (heavy, and pure), the workflows' pure helpers and input/result models (a model
# re-imported per run is rebuilt, type adapter and all, for every rollout), and logging renderers
# that a host may have installed as log handlers (rich imports lazily and touches os.getcwd, which
# the sandbox forbids). Only the workflow classes' own modules are re-imported per run.
SANDBOX_PASSTHROUGH = (
    *("pydantic", "pydantic_core", "annotated_types", "rich", "structlog", "gymflow.envs", "gymflow.activities"),
    *(
        "gymflow.activities.schema",
        "gymflow.activities.names",
        "gymflow.workflows.judging",
        "gymflow.workflows.activity_calls",
        "gymflow.workflows.budget",
        "gymflow.workflows.fused_turns",
        "gymflow.workflows.role_play",
        "gymflow.workflows.resume",
        "gymflow.workflows.children",
    ),
    "gymflow.workflows.status",
    *("gymflow.workflows.rollout_env", "gymflow.activities.session_schema", "gymflow.workflows.spans"),
    "opentelemetry",  # one trace context inside and outside the sandbox (gymflow.workers.tracing)
    "gymflow.activities.training_schema",
)
SANDBOX_RESTRICTIONS = SandboxRestrictions.default.with_passthrough_modules(*SANDBOX_PASSTHROUGH)


@functools.cache
def workflow_runner(choice: RunnerChoice = "fast") -> WorkflowRunner:
    """The runner of every gymflow worker and replayer, with gymflow's sandbox restrictions.

    `fast` is gymflow's runner unless its SDK internals are missing or changed: then the stock
    runner, with a warning (once per process) that says why.
    """
    if choice == "stock":
        return SandboxedWorkflowRunner(restrictions=SANDBOX_RESTRICTIONS)
    try:
        from gymflow.workers import sandbox_fast
    except (ImportError, AttributeError) as exc:  # a module or a name the SDK no longer has
        return _stock_because(f"its SDK internals cannot be imported ({type(exc).__name__}: {exc})")
    problem = sandbox_fast.check()
    if problem is not None:
        return _stock_because(problem)
    return sandbox_fast.FastContextRunner(restrictions=SANDBOX_RESTRICTIONS)


def _stock_because(reason: str) -> WorkflowRunner:
    import temporalio

    log.warning(
        "workflow sandbox: using the SDK's stock runner, not gymflow's fast one: %s (temporalio %s; "
        "set GYMFLOW_WORKFLOW_RUNNER=stock to choose it and silence this)",
        reason,
        temporalio.__version__,
    )
    return SandboxedWorkflowRunner(restrictions=SANDBOX_RESTRICTIONS)
