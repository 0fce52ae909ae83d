"""`gymflow.run`: the way a Python script that uses gymflow ends.

A process that created a Temporal client or worker can abort in the interpreter's teardown while
the SDK's Rust threads wind down (temporalio/sdk-python#300: ``Fatal Python error:
PyGILState_Release ...``, SIGABRT, exit 134) — after the script did everything it had to, but a
CI job or a launcher sees a crash. The `gymflow` commands never tear the interpreter down
(gymflow.workers.cli.exits); `run` gives scripts the same ending: it runs the script's coroutine,
runs the atexit handlers (a trainer's logger flushing its last steps, ...) while the interpreter is
whole, flushes stdout, stderr and the log handlers, and leaves with `os._exit`.

What that skips is the teardown itself: finalizers of objects still alive at exit. A script
releases what it starts in `finally` blocks and context managers, which have run by then.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Coroutine
from typing import Any, NoReturn

INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""


def run(main: Coroutine[Any, Any, object]) -> NoReturn:
    """Run `main` with `asyncio.run`, then end the process without the interpreter's teardown.

    Use it as a script's last line, in place of `asyncio.run(main())`, under
    `if __name__ == "__main__":`. The exit code is 0 when `main` returns, 1 (with the traceback on
    stderr) when it raises, 130 on Ctrl-C, and a `sys.exit(code)`'s code.
    """
    code = 0
    try:
        asyncio.run(main)
    except KeyboardInterrupt:
        for note in interrupt_notes():
            print(f"gymflow: interrupted: {note}", file=sys.stderr)
        code = INTERRUPTED
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    leave(code)


_interrupt_notes: list[str] = []


def note_on_interrupt(text: str) -> None:
    """Say `text` if the command or script is interrupted (Ctrl-C): what it leaves behind and how to go on
    (printed by `run` and by the `gymflow` commands' ending, gymflow.workers.cli.exits)."""
    _interrupt_notes.append(text)


def note_queue_on_interrupt(task_queue: str) -> None:
    """A command whose in-process worker polls `task_queue` alone: its workflows wait there if it stops."""
    note_on_interrupt(
        f"the workflows it started wait on task queue {task_queue}: finish them with "
        f"`gymflow worker --task-queue {task_queue}`, or cancel them in the Web UI"
    )


def interrupt_notes() -> list[str]:
    """What `note_on_interrupt` was told, in order."""
    return list(_interrupt_notes)


def leave(code: int, *, exit_handlers: bool = True) -> NoReturn:
    """Run the atexit handlers (unless told not to), flush every output, and exit with `code`
    without the interpreter's teardown."""
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; absent elsewhere
    if exit_handlers and run_exit_handlers is not None:
        with contextlib.suppress(Exception):
            run_exit_handlers()
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe has nothing to flush to
            stream.flush()
    os._exit(code)
