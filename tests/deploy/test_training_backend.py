"""The local training backend: one process per job however often it is launched, its exit code
readable by any process on the host, stop with SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gymflow.activities.trainer_backends import LocalJobs, cluster_name, group_alive, tail_file


def wait_for(predicate: object, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_concurrent_launches_of_a_job_start_one_process(tmp_path: Path) -> None:
    jobs = LocalJobs(tmp_path, "run-1")
    marker = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x'); import time; time.sleep(60)"]
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(lambda _: jobs.launch("trainer", command, cwd=tmp_path, env=dict(os.environ)), range(8))
        )
    records = {r["pid"] for r, _ in results}
    assert len(records) == 1 and sum(not reused for _, reused in results) == 1
    record = results[0][0]
    wait_for(lambda: marker.is_file() and marker.read_text() != "")  # created, then written: two steps
    assert jobs.status(record).state == "running"
    assert jobs.stop(record, grace_s=5) and jobs.status(record).state == "failed"
    assert marker.read_text() == "x"
    # A relaunch after the job ended still finds the record: the run never starts a second trainer.
    again, reused = jobs.launch("trainer", command, cwd=tmp_path, env=dict(os.environ))
    assert reused and again["pid"] == record["pid"]


@pytest.mark.parametrize(("code", "state"), [(0, "succeeded"), (3, "failed")])
def test_the_exit_code_is_read_back_by_any_process(tmp_path: Path, code: int, state: str) -> None:
    jobs = LocalJobs(tmp_path, "run-2")
    record, _ = jobs.launch("trainer", [sys.executable, "-c", f"print('bye'); raise SystemExit({code})"],
                            cwd=tmp_path, env=dict(os.environ))  # fmt: skip
    wait_for(lambda: jobs.status(record).state != "running")
    other = LocalJobs(tmp_path, "run-2")  # another worker on the host reads the records
    status = other.status(other.record("trainer") or {})
    assert (status.state, status.exit_code) == (state, code)
    assert jobs.tail(record) == "bye"


def test_a_killed_job_is_a_failure_without_an_exit_status(tmp_path: Path) -> None:
    jobs = LocalJobs(tmp_path, "run-3")
    record, _ = jobs.launch("trainer", [sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path,
                            env=dict(os.environ))  # fmt: skip
    os.killpg(record["pid"], signal.SIGKILL)  # the OOM killer takes the whole job
    wait_for(lambda: jobs.status(record).state != "running")
    status = jobs.status(record)
    assert status.state == "failed" and status.exit_code is None and "without an exit status" in status.detail


def test_stop_kills_a_job_that_ignores_sigterm(tmp_path: Path) -> None:
    jobs = LocalJobs(tmp_path, "run-4")
    script = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)"
    )
    record, _ = jobs.launch("trainer", [sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ))
    wait_for(lambda: "ready" in tail_file(Path(record["log"]), 5))
    started = time.monotonic()
    assert jobs.stop(record, grace_s=0.5)
    # The shell died of the SIGTERM; its child did not, and was killed with the whole group.
    assert not jobs.running(record) and not group_alive(record["pid"]) and time.monotonic() - started < 7


def test_cluster_names_are_valid_for_skypilot() -> None:
    assert cluster_name("Math_Reference.v2") == "gymflow-train-math-reference-v2"
    assert len(cluster_name("x" * 100)) <= 63
