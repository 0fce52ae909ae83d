"""Progress output: a bar on a terminal, plain lines (no carriage returns) anywhere else."""

from __future__ import annotations

import io

from gymflow.workers.sdk.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_not_a_terminal_prints_a_line_per_tenth_or_ten_seconds_and_never_a_carriage_return() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, 100, tty=False, clock=clock)
    for done in range(0, 100):
        progress.update(done, "rollouts")  # the same count polled again adds nothing
        progress.update(done, "rollouts")
    clock.now = 30.0
    progress.update(99, "rollouts")  # 10 s since the last line: a line
    progress.update(99, "rollouts")  # the same line again: nothing
    clock.now = 35.0
    progress.update(99, "rollouts, 1 rejected")  # changed, but neither a new tenth nor 10 s: nothing
    progress.close(100, "rollouts")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "progress: 0/100 rollouts"
    assert [line for line in lines if line.endswith("0/100 rollouts")][:3] == [
        "progress: 0/100 rollouts", "progress: 10/100 rollouts", "progress: 20/100 rollouts",
    ]  # fmt: skip
    assert lines[-2:] == ["progress: 99/100 rollouts", "progress: 100/100 rollouts"]
    assert len(lines) == 12


def test_a_terminal_gets_a_redrawn_bar_that_ends_with_the_final_count() -> None:
    out = io.StringIO()
    progress = Progress(out, 16, tty=True)
    progress.update(7, "rollouts")
    progress.close(16, "rollouts")
    assert out.getvalue() == (f"\r[{'#' * 13}{'.' * 17}] 7/16 rollouts\r[{'#' * 30}] 16/16 rollouts\n")
