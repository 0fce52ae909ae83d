"""Progress output for long CLI commands: a redrawn bar on a terminal, plain lines elsewhere.

Piped or redirected (a log file, CI), a bar's carriage returns would pile up into one unreadable
line, so there the progress is one plain line each time another 10 % is done or 10 s have passed,
and always a last line with the final count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TextIO

Reading = tuple[int, str]
"""(units done, text after the count), e.g. (7, "rollouts")."""


class Progress:
    """Draws progress toward `total` on `out`."""

    def __init__(
        self, out: TextIO, total: int, *, tty: bool | None = None, every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.out = out
        self.total = max(total, 0)
        self.tty = out.isatty() if tty is None else tty
        self.every_s = every_s
        self.clock = clock
        self._last_line_at: float | None = None
        self._last_tenth = -1
        self._last_text: str | None = None

    def _line(self, done: int, text: str) -> str:
        return f"{done}/{self.total} {text}"

    def update(self, done: int, text: str) -> None:
        line = self._line(done, text)
        if self.tty:
            filled = int(30 * min(done, self.total) / max(self.total, 1))
            self.out.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {line}")
            self.out.flush()
            return
        tenth = int(10 * min(done, self.total) / max(self.total, 1))
        now = self.clock()
        due = self._last_line_at is None or now - self._last_line_at >= self.every_s
        if (tenth > self._last_tenth or due) and line != self._last_text:
            self.out.write(f"progress: {line}\n")
            self.out.flush()
            self._last_line_at, self._last_tenth, self._last_text = now, tenth, line

    def close(self, done: int, text: str) -> None:
        """The final count, always shown once."""
        if self.tty:
            self.update(done, text)
            self.out.write("\n")
        elif self._line(done, text) != self._last_text:
            self.out.write(f"progress: {self._line(done, text)}\n")
        self.out.flush()


async def follow(
    progress: Progress, read: Callable[[], Awaitable[Reading]], finished: asyncio.Event, *, interval_s: float = 0.5
) -> Reading:
    """Poll `read` every `interval_s` and draw it until `finished` is set; returns the last reading.
    A failed read (a query racing a continue-as-new) keeps the previous reading."""
    reading: Reading = (0, "")
    while not finished.is_set():
        with contextlib.suppress(Exception):
            reading = await read()
        progress.update(*reading)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), interval_s)
    return reading
