"""Logs are structured lines on stderr with their context; `--json` stdout holds the document alone,
even while the SDK's Rust core, the SDK's Python side and gymflow all warn."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from gymflow.workers import logs
from gymflow.workers.cli.main import build_parser
from gymflow.workers.servers.policy import AppServer

ROOT = Path(__file__).parents[2]
PROGRESS = re.compile(r"^(\[\d+/\d+\] |progress: \d+/\d+ )")
"""The commands' own progress lines (gymflow.workers.sdk.progress, off a terminal), not log lines."""


def _gymflow(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=False,
    )  # fmt: skip


def _log_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line parsed as a JSON object; progress lines are the only other kind."""
    found = []
    for line in stderr.splitlines():
        if not line.strip() or PROGRESS.match(line):
            continue
        try:
            value = json.loads(line)  # fails the test on any line that is neither
        except json.JSONDecodeError:
            raise AssertionError(f"stderr line is neither a log line nor progress: {line!r}") from None
        assert isinstance(value, dict), line
        found.append(value)
    return found


@pytest.mark.parametrize("command", [pytest.param("rollout", marks=pytest.mark.slow), "eval"])  # one CLI run by default
@pytest.mark.heavy
async def test_json_stdout_is_pure_while_core_sdk_and_gymflow_warn(
    command: str, temporal_address: str, calculator_policy_url: str, tmp_path: Path
) -> None:
    first: list[bool] = []

    async def flaky(request: Request) -> JSONResponse:
        # The first model call fails retryably: the SDK logs the failed attempt (a Python-side warning).
        if not first:
            first.append(True)
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        async with httpx.AsyncClient() as http:
            reply = await http.post(f"{calculator_policy_url}/chat/completions", content=await request.body())
        return JSONResponse(reply.json(), status_code=reply.status_code)

    async with AppServer(Starlette(routes=[Route("/v1/chat/completions", flaky, methods=["POST"])])) as server:
        run = await asyncio.to_thread(
            _gymflow,
            command, "math", "--n", "2", "--model-url" if command == "rollout" else "--policy", server.url, "--json",
            "--address", temporal_address, "--task-queue", f"logs-{uuid.uuid4().hex[:8]}",
            cwd=tmp_path,
            # Every workflow task is "slow" for the core: its [TMPRL1104] warning on each one.
            env={"TEMPORAL_WORKFLOW_TASK_DURATION_WARN_SECONDS": "0"},
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)  # the document alone: no log line, no note around it
    if command == "rollout":
        assert report["summary"]["completed"] == 2 and report["summary"]["mean_reward"] == 1.0
        rollout_ids = {r["workflow_id"] for r in report["rollouts"]}
    else:
        policy = report["policy"]
        assert policy["rollouts"] == policy["completed"] == 2 and policy["mean"]["value"] == 1.0, policy
    lines = _log_lines(run.stderr)

    core = [line for line in lines if line["logger"] == logs.CORE_LOGGER]
    assert core, run.stderr[-3000:]
    assert all("[TMPRL1104]" in c["event"] and c["level"] == "warning" for c in core)
    assert {c["workflow_type"] for c in core} >= {"RolloutWorkflow"}
    assert all("workflow_task_duration" in c for c in core)
    assert all(c["run_id"] in c["event"] for c in core)

    [failed] = [line for line in lines if line["logger"] == "temporalio.activity"]
    assert failed["activity"] == "play_turn" and failed["attempt"] == 1  # math fuses its turns
    assert failed["workflow_type"] == "RolloutWorkflow" and failed["env"] == "math" and failed["state_key"]
    assert failed["rollout_id"] == failed["workflow_id"]
    if command == "rollout":
        assert failed["workflow_id"] in rollout_ids
    assert failed["run_id"] and failed["node"] and failed["level"] == "warning"
    # A retried, typed failure is one line: its type and message, no traceback.
    assert failed["event"] == "activity attempt failed" and failed["expected"] is True
    assert failed["error_type"] == "ModelError" and "503" in failed["error"] and failed["retryable"] is True
    assert "exception" not in failed and "Traceback" not in run.stderr


def _capture(fmt: logs.LogFormat = "json") -> io.StringIO:
    stream = io.StringIO()
    logs.configure(fmt=fmt, level=logging.INFO, stream=stream)
    return stream


def test_console_format_is_readable_and_names_the_context() -> None:
    stream = _capture("console")
    logging.getLogger("gymflow.test").warning("tool raised", extra={"env": "math", "tool": "add"})
    line = stream.getvalue().strip()
    assert "tool raised" in line and "env=math" in line and "tool=add" in line and not line.startswith("{")


def test_a_cancelled_attempt_is_one_line_a_bug_keeps_its_traceback() -> None:
    stream = _capture()
    sdk = logging.getLogger("temporalio.activity")

    def throw(exc: BaseException) -> None:
        raise exc

    def fail(exc: BaseException) -> None:
        try:
            throw(exc)
        except BaseException:
            sdk.warning("Completing activity as failed", exc_info=True)

    fail(asyncio.CancelledError())
    fail(ValueError("a real bug"))
    cancelled, bug = (json.loads(line) for line in stream.getvalue().splitlines())
    assert cancelled["expected"] is True and "exception" not in cancelled and "cancelled" in cancelled["event"]
    [exc] = bug["exception"]
    assert exc["exc_type"] == "ValueError" and exc["frames"] and "expected" not in bug
    assert all("locals" not in frame for frame in exc["frames"])  # frame locals may hold secrets


@pytest.fixture(autouse=True)
def _restore_logging() -> Any:
    yield
    logs.configure(fmt="json", level=logging.WARNING, stream=sys.stderr)


def test_third_party_loggers_stay_at_warning_unless_verbose() -> None:
    from gymflow.envs.datagen.index import Bm25Index

    library, own = logging.getLogger("somelib.core"), logging.getLogger("gymflow.envs.datagen.test")
    library.setLevel(logging.DEBUG)  # as bm25s does to its logger when imported
    own.setLevel(logging.DEBUG)  # a developer debugging one gymflow module
    try:
        for level, expected in ((logging.WARNING, ["warning"]), (logging.INFO, ["info", "warning"])):
            stream = io.StringIO()
            logs.configure(fmt="json", level=level, stream=stream)
            for name in ("debug", "info", "warning"):
                getattr(library, name)(f"library {name}")
            own.debug("own debug")
            logging.getLogger("bm25s").setLevel(logging.DEBUG)
            Bm25Index(["canal towns", "town halls"]).search("canal")  # logs "Building index ..." at DEBUG
            events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
            assert events == [f"library {name}" for name in expected] + ["own debug"], (level, events)
    finally:
        library.setLevel(logging.NOTSET)
        own.setLevel(logging.NOTSET)


def test_log_flags_go_before_or_after_the_subcommand() -> None:
    parser = build_parser()
    assert parser.parse_args(["eval", "math"]).log_format == "auto"
    assert parser.parse_args(["--log-format", "json", "eval", "math"]).log_format == "json"
    after = parser.parse_args(["train", "list", "--log-format", "console", "-v"])
    assert after.log_format == "console" and after.verbose


@activity.defn(name="starved")
async def starved() -> str:
    """Attempt 1 blocks its event loop past the heartbeat timeout (a starved worker), then waits."""
    if activity.info().attempt == 1:
        activity.heartbeat()
        time.sleep(3)  # noqa: ASYNC251 - the starvation under test
        activity.heartbeat()  # answered "timed out": the SDK cancels this attempt
        await asyncio.sleep(60)
    return "ok"


@workflow.defn(sandboxed=False)
class StarvedWorkflow:
    @workflow.run
    async def run(self) -> str:
        return await workflow.execute_activity(
            starved,
            start_to_close_timeout=timedelta(seconds=90),
            heartbeat_timeout=timedelta(seconds=1),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
        )


async def test_an_attempt_cancelled_by_its_heartbeat_timeout_is_one_line(client: Client) -> None:
    stream = _capture()
    queue = f"starved-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[StarvedWorkflow], activities=[starved]):
        result = await client.execute_workflow(StarvedWorkflow.run, id=queue, task_queue=queue)
        assert result == "ok"
        await _wait_for_line(stream, "activity attempt cancelled")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    [cancelled] = [line for line in lines if line["event"].startswith("activity attempt cancelled")]
    assert cancelled["activity"] == "starved" and cancelled["attempt"] == 1 and cancelled["expected"] is True
    assert cancelled["workflow_id"] == queue and "exception" not in cancelled
    assert not any("exception" in line for line in lines), lines


async def _wait_for_line(stream: io.StringIO, text: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in stream.getvalue():
        assert time.monotonic() < deadline, stream.getvalue()
        await asyncio.sleep(0.05)
