"""Launching training jobs: a local subprocess, or a SkyPilot cluster through its 0.14 Python API.

Both backends are idempotent by run id, so a retried or repeated launch never starts a second
trainer:

* local: every job of a run (the trainer, the run's policy services) has a record in
  `<data dir>/training/<run id>/<job>.json`, written under a file lock before the process is
  started; a launch that finds the record returns it. The process runs in its own session (it
  outlives the worker that started it, which may be killed) under a shell that writes its exit
  code to `<job>.exit`, so any worker on the host can tell how it ended.
* skypilot: the cluster is `gymflow-train-<run id>` and the job is named after the run; a launch
  that finds that job in the cluster's queue returns it instead of submitting another.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gymflow.envs.mcp.ledger import pid_alive, start_time

TRAINER = "trainer"
"""The job name of a run's trainer."""
KILL_CONFIRM_S = 5.0
LOG_TAIL_LINES = 20


def import_sky() -> Any:
    """The `sky` module (SkyPilot's Python API), imported on first use: skypilot is an optional extra."""
    try:
        import sky
    except ImportError as exc:
        raise RuntimeError("the SkyPilot backend needs skypilot: pip install 'gymflow[skypilot]'") from exc
    return sky


@dataclass
class JobStatus:
    """How a job is doing: `running`, `succeeded`, `failed` (exit code, or None when it vanished)."""

    state: str
    exit_code: int | None = None
    detail: str = ""


def cluster_name(run_id: str) -> str:
    """The SkyPilot cluster of a run (lower case, at most 63 characters)."""
    return ("gymflow-train-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()))[:63].rstrip("-")


class LocalJobs:
    """A run's local processes, recorded under `<data_dir>/training/<run_id>/`."""

    def __init__(self, data_dir: Path, run_id: str) -> None:
        self.dir = data_dir.resolve() / "training" / run_id
        self.run_id = run_id

    def record(self, name: str) -> dict[str, Any] | None:
        """The job's record, or None if it was never launched on this host."""
        path = self.dir / f"{name}.json"
        try:
            return dict(json.loads(path.read_text()))
        except FileNotFoundError:
            return None

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.dir.glob("*.json"))]

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def launch(
        self,
        name: str,
        command: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        extra: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Start job `name` unless it was started before; returns (record, reused).

        The record is written before the process starts, under a lock: two launches of the same
        job, concurrent or not, start one process.
        """
        with self._lock():
            existing = self.record(name)
            if existing is not None:
                return existing, True
            log = self.dir / f"{name}.log"
            exit_file = self.dir / f"{name}.exit"
            exit_file.unlink(missing_ok=True)
            # The shell outlives nothing but its command, and records how it ended for any worker.
            wrapper = (
                '"$@"; code=$?; echo "$code" > "$GYMFLOW_EXIT_FILE.tmp"; '
                'mv "$GYMFLOW_EXIT_FILE.tmp" "$GYMFLOW_EXIT_FILE"; exit "$code"'
            )
            with log.open("ab") as out:
                process = subprocess.Popen(
                    ["sh", "-c", wrapper, "sh", *command],
                    cwd=cwd,
                    env={**env, "GYMFLOW_EXIT_FILE": str(exit_file)},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            record = {
                "name": name,
                "pid": process.pid,
                "start": start_time(process.pid),
                "log": str(log),
                "exit_file": str(exit_file),
                "command": list(command),
                **(extra or {}),
            }
            tmp = self.dir / f".{name}.json.tmp"
            tmp.write_text(json.dumps(record))
            tmp.replace(self.dir / f"{name}.json")
            return record, False

    @staticmethod
    def running(record: Mapping[str, Any]) -> bool:
        """The job's shell lives, or any process of its group does (a child may outlive the shell,
        e.g. one that ignores the SIGTERM the shell died of)."""
        pid = int(record["pid"])
        return (start_time(pid) == record["start"] and pid_alive(pid)) or group_alive(pid)

    def status(self, record: Mapping[str, Any]) -> JobStatus:
        """`running` while the process lives; then its exit code from the exit file."""
        if self.running(record):
            return JobStatus("running")
        try:
            code = int(Path(record["exit_file"]).read_text().strip())
        except (OSError, ValueError):
            return JobStatus("failed", None, "the process is gone without an exit status (killed?)")
        return JobStatus("succeeded" if code == 0 else "failed", code)

    def stop(self, record: Mapping[str, Any], *, grace_s: float) -> bool:
        """SIGTERM the job's process group, SIGKILL it after `grace_s`; True if it was running."""
        if not self.running(record):
            return False
        pid = int(record["pid"])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        if not _wait(lambda: not self.running(record), grace_s):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _wait(lambda: not self.running(record), KILL_CONFIRM_S)
        return True

    @staticmethod
    def tail(record: Mapping[str, Any], lines: int = LOG_TAIL_LINES) -> str:
        return tail_file(Path(record["log"]), lines)


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of process group `pgid` remains on this host."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in {"Z", "X"}:
            return True
    return False


def tail_file(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file ('' if it is missing)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _wait(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- SkyPilot ----------------------------------------------------------------------------------
def task_config(
    task_file: Path, *, env: Mapping[str, str], resources: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The trainer task YAML with the run's environment, resources and secret values applied.

    Raises:
        ValueError: The file is not a SkyPilot task mapping with a `run` script.
    """
    environ = os.environ if environ is None else environ
    config = yaml.safe_load(task_file.read_text())
    if not isinstance(config, dict) or not isinstance(config.get("run"), str):
        raise ValueError(f"{task_file}: not a SkyPilot task with a 'run' script")  # noqa: TRY004
    if resources:
        config["resources"] = {**(config.get("resources") or {}), **resources}
    config["envs"] = {**(config.get("envs") or {}), **env}
    secrets = {name: environ.get(name) for name in config.get("secrets") or {}}
    config["secrets"] = {name: value for name, value in secrets.items() if value}
    if not config["secrets"]:
        config.pop("secrets")
    return config


def validate_task(config: Mapping[str, Any]) -> None:
    """Let the real SkyPilot parse the task (resources included).

    Raises:
        RuntimeError: skypilot is not installed.
        ValueError: SkyPilot refuses the task; the message is SkyPilot's.
    """
    sky = import_sky()
    try:
        sky.Task.from_yaml_config(dict(config))
    except Exception as exc:  # SkyPilot raises ValueError and its own config errors
        raise ValueError(f"SkyPilot refuses the trainer task: {exc}") from exc


def _job_name(run_id: str) -> str:
    return f"gymflow-{run_id}"


def skypilot_find(run_id: str) -> int | None:
    """The id of the run's job on its cluster, or None when there is no such cluster or job."""
    sky = import_sky()
    try:
        records = sky.stream_and_get(sky.queue(cluster_name(run_id)))
    except (sky.exceptions.ClusterDoesNotExist, sky.exceptions.ClusterNotUpError):
        return None
    for record in records or []:
        name = getattr(record, "job_name", None) or (record.get("job_name") if isinstance(record, dict) else None)
        if name == _job_name(run_id):
            return int(getattr(record, "job_id", None) or record["job_id"])
    return None


def skypilot_launch(run_id: str, config: Mapping[str, Any]) -> tuple[int, bool]:
    """Launch the trainer task on the run's cluster unless its job exists; returns (job id, reused)."""
    if (job_id := skypilot_find(run_id)) is not None:
        return job_id, True
    sky = import_sky()
    task = sky.Task.from_yaml_config(dict(config))
    task.name = _job_name(run_id)
    job_id, _handle = sky.stream_and_get(sky.launch(task, cluster_name=cluster_name(run_id)))
    return int(job_id), False


def skypilot_status(run_id: str, job_id: int) -> JobStatus:
    sky = import_sky()
    statuses = sky.stream_and_get(sky.job_status(cluster_name(run_id), [job_id])) or {}
    status = statuses.get(job_id)
    value = getattr(status, "value", status)
    if value in {"SUCCEEDED"}:
        return JobStatus("succeeded", 0)
    if value in {"FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED"} or value is None:
        return JobStatus("failed", None, f"SkyPilot job {job_id}: {value or 'gone'}")
    return JobStatus("running")


def skypilot_tail(run_id: str, job_id: int, lines: int = LOG_TAIL_LINES) -> str:
    sky = import_sky()
    out = io.StringIO()
    sky.tail_logs(cluster_name(run_id), job_id, follow=False, tail=lines, output_stream=out)
    return "\n".join(out.getvalue().splitlines()[-lines:])


def skypilot_cancel(run_id: str, job_id: int) -> None:
    sky = import_sky()
    sky.stream_and_get(sky.cancel(cluster_name(run_id), job_ids=[job_id]))


def skypilot_down(run_id: str) -> None:
    sky = import_sky()
    with contextlib.suppress(sky.exceptions.ClusterDoesNotExist):
        sky.stream_and_get(sky.down(cluster_name(run_id)))
