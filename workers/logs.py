"""Logging: one configuration for every command, structured lines on stderr.

Every `gymflow` command calls `configure()` once. Log records of every origin — gymflow's own
(stdlib loggers with `extra=` fields, so library code needs no logging setup), the Temporal SDK's
Python loggers, its Rust core (forwarded into the `temporalio.core` logger by `core_runtime()`,
which `gymflow.workers.client.connect` uses), aiohttp, mcp — pass through one structlog
`ProcessorFormatter` on one stderr handler: JSON lines when stderr is not a terminal (or
`--log-format json`), readable console lines on a terminal. stdout is left to the commands'
documents (`--json`).

A line carries what is known where it was logged: `workflow_id`, `run_id`, `workflow_type`,
`rollout_id` (a rollout workflow's id), `activity` (type), `attempt`, `env`, `node`. Activity
fields come from the SDK's `temporal_activity` extra, or from `temporalio.activity.info()` for
loggers that are not the SDK's; workflow fields from `workflow.logger`'s `temporal_workflow`
extra (that logger is replay-safe: it is silent while a workflow replays, and the formatter does
no I/O inside the sandbox — it writes through the host's handler). `node` and `env` are bound
with structlog contextvars by the worker and the env activities.

Third-party loggers stay at the level the command runs at (WARNING; INFO with ``-v``) whatever
level a library sets on its own logger (bm25s sets DEBUG when imported): `ThirdPartyLevel` on the
handler drops their records below it. gymflow's own loggers keep the levels set on them.

Expected activity endings (a cancelled attempt: heartbeat or start-to-close timeout, a cancelled
rollout) are one line without traceback (`ExpectedEndings`); unexpected errors keep theirs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, TextIO

import structlog
import temporalio.activity
import temporalio.exceptions
import temporalio.workflow
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

LogFormat = Literal["auto", "json", "console"]
LOG_FORMATS: tuple[str, ...] = ("auto", "json", "console")
CORE_LOGGER = "temporalio.core"
"""The Python logger the SDK's Rust core logs into (`[TMPRL1104] ...` slow workflow tasks, ...)."""
_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_TEMPORAL_EXTRAS = frozenset(
    {"temporal_activity", "temporal_workflow", "temporal_log", "activity_info", "workflow_info"}
)

_HANDLER_MARK = "_gymflow_handler"
OWN_LOGGERS = frozenset({"gymflow", "bench", "__main__"})
"""Top-level logger names of gymflow's own code: every other logger is a third party's."""


@functools.cache
def core_runtime() -> Runtime:
    """The process's Temporal runtime, with the core's logs forwarded to the `temporalio.core` logger.

    Without it the core writes its own lines to the process's stdout (breaking `--json`); with it,
    they are log records like any other, filtered by level and formatted by `configure()`.
    """
    return Runtime(telemetry=core_telemetry())


def core_telemetry() -> TelemetryConfig:
    """`core_runtime`'s telemetry: the core's logs forwarded (a worker adds metrics: gymflow.workers.metrics)."""
    forwarding = LogForwardingConfig(
        logger=logging.getLogger(CORE_LOGGER),
        append_target_to_name=False,
        prepend_target_on_message=False,
        append_log_fields_to_message=False,
    )
    filter_ = TelemetryFilter(core_level="WARN", other_level="ERROR")
    return TelemetryConfig(logging=LoggingConfig(filter=filter_, forwarding=forwarding))


def _info_details(info: temporalio.activity.Info) -> dict[str, Any]:
    # What the SDK's activity logger adds to a record (its `extra`), read from Info's public fields.
    return {
        "activity_id": info.activity_id,
        "activity_type": info.activity_type,
        "attempt": info.attempt,
        "workflow_id": info.workflow_id,
        "workflow_run_id": info.workflow_run_id,
        "workflow_type": info.workflow_type,
    }


def _activity_fields(details: Mapping[str, Any]) -> dict[str, Any]:
    fields = {
        "workflow_id": details.get("workflow_id"),
        "run_id": details.get("workflow_run_id"),
        "workflow_type": details.get("workflow_type"),
        "activity": details.get("activity_type"),
        "activity_id": details.get("activity_id"),
        "attempt": details.get("attempt"),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _workflow_fields(details: Mapping[str, Any]) -> dict[str, Any]:
    fields = {
        "workflow_id": details.get("workflow_id"),
        "run_id": details.get("run_id"),
        "workflow_type": details.get("workflow_type"),
        "attempt": details.get("attempt"),
        "update": details.get("update_name"),
    }
    return {k: v for k, v in fields.items() if v is not None}


_ROLLOUT_WORKFLOWS = {"RolloutWorkflow", "RolloutSessionWorkflow"}
_CORE_RUN_ID = re.compile(r"\[TMPRL\d+\] ([0-9a-f-]{36}):")


def temporal_context(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the Temporal and gymflow context of the line (see the module doc)."""
    record: logging.LogRecord | None = event.get("_record")
    found: dict[str, Any] = {}
    if record is not None:
        if isinstance(details := getattr(record, "temporal_activity", None), Mapping):
            found |= _activity_fields(details)
        if isinstance(details := getattr(record, "temporal_workflow", None), Mapping):
            found |= _workflow_fields(details)
        core = getattr(record, "temporal_log", None)
        if core is not None:
            found["target"] = core.target
            found |= {str(k): v for k, v in (core.fields or {}).items()}
            if "run_id" not in found and (run := _CORE_RUN_ID.match(str(record.msg))):
                found["run_id"] = run[1]  # "[TMPRL1104] {run_id}:{event_id}:{attempt} ..."
        # Any other `extra=` of a log call is a field (gymflow's own: env, tool, state_key, ...).
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and key not in _TEMPORAL_EXTRAS and not key.startswith("_"):
                found[key] = value
    if "activity" not in found and temporalio.activity.in_activity():
        found |= _activity_fields(_info_details(temporalio.activity.info()))
    if "rollout_id" not in found and "workflow_id" in found and found.get("workflow_type") in _ROLLOUT_WORKFLOWS:
        found["rollout_id"] = found["workflow_id"]
    for key, value in found.items():
        event.setdefault(key, value)
    return event


_CANCELLED = (asyncio.CancelledError, temporalio.exceptions.CancelledError)


class ExpectedEndings(logging.Filter):
    """An activity attempt that ended the way gymflow expects is one line, not a traceback.

    The SDK logs "Completing activity as failed" with the traceback of every attempt that did not
    return. Two endings are expected and say all in one line:

    * a `CancelledError`: the server timed the attempt out (heartbeat or start-to-close) and the
      retry policy runs the next one, or the rollout was cancelled — the traceback would only show
      where the activity was awaiting;
    * an `ApplicationError`: raised on purpose at a boundary (a 503 from the model endpoint, a
      server that did not start), typed for the RetryPolicy; its type and message are the news.

    Any other exception is a bug somewhere and keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or record.name != temporalio.activity.logger.logger.name:
            return True
        if isinstance(exc, _CANCELLED):
            record.msg = "activity attempt cancelled (timed out, or cancelled by its workflow)"
        elif isinstance(exc, temporalio.exceptions.ApplicationError):
            record.msg = "activity attempt failed"
            record.error_type, record.error = exc.type, exc.message
            record.retryable = not exc.non_retryable
            if exc.__cause__ is not None:
                record.cause = f"{type(exc.__cause__).__name__}: {exc.__cause__}"
        else:
            return True
        record.args, record.exc_info, record.exc_text = (), None, None
        record.expected = True
        return True


class ThirdPartyLevel(logging.Filter):
    """A third party's record passes at `level` or above only, whatever level its logger has.

    Args:
        level: The level the process logs at (the root logger's).
    """

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or record.name.split(".", 1)[0] in OWN_LOGGERS


# Tracebacks as data, without frame locals (they may hold keys or whole conversations).
_JSON_TRACEBACKS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


def _renderer(fmt: LogFormat, stream: TextIO) -> Any:
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    if fmt == "json":
        return structlog.processors.JSONRenderer(default=str)
    return structlog.dev.ConsoleRenderer(colors=stream.isatty(), exception_formatter=structlog.dev.plain_traceback)


def configure(*, fmt: LogFormat = "auto", level: int = logging.WARNING, stream: TextIO | None = None) -> None:
    """Route every log record of the process to one structured handler on `stream` (stderr).

    Idempotent: a second call replaces the handler the first installed (tests call it with a
    buffer; the CLI once per command). Other handlers on the root logger are left alone.
    """
    stream = stream or sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        temporal_context,
    ]
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    json_lines = not isinstance(_renderer(fmt, stream), structlog.dev.ConsoleRenderer)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.PositionalArgumentsFormatter(), *shared],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *([_JSON_TRACEBACKS] if json_lines else []),
            _renderer(fmt, stream),
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(ExpectedEndings())
    handler.addFilter(ThirdPartyLevel(level))
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # The context is in fields: the SDK's adapters need not append it to the message text.
    temporalio.activity.logger.activity_info_on_message = False
    temporalio.workflow.logger.workflow_info_on_message = False
    logging.captureWarnings(True)  # warnings.warn (the SDK's included) as log lines, not raw stderr text
