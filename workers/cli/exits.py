"""How every `gymflow` command ends: one line for an expected error, and no interpreter teardown.

Exit codes, whatever the command:

- an expected error (`gymflow.envs.errors.UserError`: a bad file, a mistyped env or policy name, an invalid
  config or setting, no server at an address) is one ``gymflow: <message>`` line, exit 2. The
  message names the fix; a traceback would only bury it.
- a workflow the command ran failed: its cause, one line. Exit 2 when the cause is the input's
  fault (an invalid input, an env's config, a training config, a bad dataset row), else 1.
- the Temporal server refused a request: its message, one line; exit 2 when the request named
  something that is not there (an unknown workflow id), else 1.
- anything else is a bug: its traceback, exit 1. Ctrl-C: 130.

The console script then leaves with `os._exit`, after flushing stdout, stderr and the log handlers,
on success as on failure. A process that created a Temporal client or worker can abort in the
interpreter's teardown while the SDK's Rust threads wind down (temporalio/sdk-python#300:
``Fatal Python error: PyGILState_Release ...``, SIGABRT, exit 134), after printing everything it
had to say. What `os._exit` skips (atexit handlers, finalizers of leftover objects) nothing here
needs: commands release what they start in `finally` blocks and context managers, which have run
by then.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from gymflow.envs.errors import UserError
from gymflow.workers.sdk import scripts

INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""
USER_ERROR = 2
"""Exit code of an expected error (and of argparse's usage errors)."""

_INPUT_FAULTS = frozenset({"InvalidInput", "EnvConfigError", "TrainingConfigError"})
"""ApplicationError types (gymflow.activities.errors) that mean the workflow's input was at fault."""


def run(command: Callable[[], int], *, err: Any = None) -> int:
    """Run `command` and turn whatever it raises into an exit code, saying why on `err` (stderr)."""
    err = err or sys.stderr
    try:
        return command()
    except UserError as exc:
        print(f"gymflow: {exc}", file=err)
        return USER_ERROR
    except KeyboardInterrupt:
        for note in scripts.interrupt_notes():
            print(f"gymflow: interrupted: {note}", file=err)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (`gymflow inspect ID | head`): nothing left to say
        return 0
    except SystemExit as exc:  # sys.exit() somewhere below: keep its code, still leave through here
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=err)
        return 1
    except Exception as exc:
        failed = workflow_failure(exc) or refused(exc)
        if failed is None:
            traceback.print_exc(file=err)
            return 1
        code, message = failed
        print(f"gymflow: {message}", file=err)
        return code


def workflow_failure(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for a failed workflow the command waited on; None for any other error.

    The line is the message of the outermost application error under the failure: the workflow's
    or activity's own words (``cannot load dataset 'x.jsonl' of math: x.jsonl:1: invalid JSON``),
    never the remote traceback an exception from a process pool carries at the bottom of the chain.
    """
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError, FailureError

    if not isinstance(exc, WorkflowFailureError):
        return None
    chain: list[BaseException] = []
    cause: BaseException | None = exc.cause
    while cause is not None and len(chain) < 32:
        chain.append(cause)
        cause = cause.cause if isinstance(cause, FailureError) else cause.__cause__
    applications = [c for c in chain if isinstance(c, ApplicationError)]
    faults = _INPUT_FAULTS | user_error_types()
    for error in applications:
        if error.type in faults:
            return USER_ERROR, error.message
    first = applications[0] if applications else (chain[0] if chain else exc)
    message = getattr(first, "message", None) or str(first)
    return 1, f"the workflow failed: {message}"


def refused(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for a request the Temporal server refused (an unknown workflow id, ...)."""
    from temporalio.service import RPCError, RPCStatusCode

    if not isinstance(exc, RPCError):
        return None
    asked_wrong = exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.ALREADY_EXISTS)
    return (USER_ERROR if asked_wrong else 1), f"the Temporal server refused: {exc.message}"


def user_error_types() -> frozenset[str]:
    """Class names of every UserError subclass loaded: the ApplicationError type an activity raising
    one of them reports (the SDK names a plain exception's failure after its class)."""
    names: set[str] = set()
    pending = [UserError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending += cls.__subclasses__()
    return frozenset(names)


def leave(code: int) -> NoReturn:
    """Flush what the command printed and logged, and exit without the interpreter's teardown."""
    scripts.leave(code, exit_handlers=False)
