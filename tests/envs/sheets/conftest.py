"""Fixtures for the spreadsheet env tests: a private generator cache and small generated datasets."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gymflow.envs.builtin.sheets import generate
from gymflow.envs.builtin.sheets.env import SheetsEnv
from gymflow.envs.builtin.sheets.generate import CACHE_ENV
from gymflow.envs.builtin.sheets.isolation import choose
from gymflow.envs.contract import Task

NEEDS_BWRAP = "needs bubblewrap: apt-get install bubblewrap"


def skip_unless_code_runs() -> None:
    """Skip a test that runs model code (run_python) where it would be refused: no bubblewrap here."""
    isolation = choose()
    if isolation.refuse_code:
        pytest.skip(f"run_python refuses here: no sandbox level guarantees isolation: {NEEDS_BWRAP}")


@pytest.fixture
def code_runs() -> None:
    """Skips the test where run_python would refuse (see `skip_unless_code_runs`)."""
    skip_unless_code_runs()


@pytest.fixture(scope="session", autouse=True)
def sheets_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Generated workbooks go to a per-session cache, never the user's."""
    root = tmp_path_factory.mktemp("sheets-cache")
    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(root)
    yield root
    if previous is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = previous


@pytest.fixture(scope="session")
def tasks(sheets_cache: Path) -> list[Task]:
    """Eighteen generated tasks: every family twice."""
    return list(SheetsEnv.load_dataset("generated", n=18, seed=0))


@pytest.fixture(scope="session")
def answers(tasks: list[Task]) -> dict[str, str]:
    """Task id -> its answer workbook, written as a SpreadsheetBench checkout holds them (0700 cache).

    The env never writes them (generated tasks carry their cells): tests that need an answer file
    (the reward's file path, attempts to read one) ask for them here.
    """
    directory = generate.write_dataset(len(tasks), seed=0, answers=True)
    return {
        t.id: str(directory / "spreadsheet" / t.metadata["row_id"] / f"1_{t.metadata['row_id']}_answer.xlsx")
        for t in tasks
    }


@pytest.fixture(scope="module")
async def sheets_env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SheetsEnv]:
    """The env with real MCP server processes (the strongest sandbox available here)."""
    env = SheetsEnv(workspace_root=tmp_path_factory.mktemp("sheets-ws"), pool_size=1)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on the host's loopback that accepts connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()
