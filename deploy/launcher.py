"""Launching worker fleets: SkyPilot clusters, or the same worker command as local processes.

`deploy/workers.yaml` is the one description of a worker node. The SkyPilot backend launches it
with the SkyPilot 0.14 Python API (imported lazily: skypilot is an optional extra, and
`--dryrun` only prints the task). The local backend runs the YAML's very `run` script as N local
processes, `SKYPILOT_NODE_RANK` set to 0..N-1 so each has its own node id and node queue; their
pids are kept in `<data dir>/workers/` for `gymflow deploy down --backend local`.

The cluster's credentials travel apart from the task's `envs` (which SkyPilot shows and stores):
an API key and inline TLS data as SkyPilot `secrets` (values from the resolved connection,
redacted by `--dryrun`), certificate and key files as `file_mounts` (the task names only their
paths; SkyPilot copies the files to `~/.gymflow/tls/` on each node, a local node reads them in
place). None of it enters a workflow's input or history.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from gymflow.activities.trainer_backends import import_sky
from gymflow.envs.mcp.ledger import pid_alive, start_time

TASK_FILE = Path(__file__).with_name("workers.yaml")
"""The worker node task shipped with gymflow."""
DEFAULT_CLUSTER = "gymflow-workers"
STOP_TIMEOUT_S = 15.0
"""How long a local worker gets to shut down gracefully before it is killed."""
KILL_CONFIRM_S = 5.0
"""How long a killed local worker gets to be gone before `down_local` returns anyway."""


class ClusterCredentials(Protocol):
    """A resolved cluster connection as the launcher reads it (gymflow.workers.connection's
    `Connection` is one): the `TEMPORAL_*` variables that reach the cluster."""

    def environment(self) -> dict[str, str]: ...


@dataclass
class FleetSpec:
    """What to launch."""

    nodes: int
    temporal_address: str
    task_queue: str
    namespace: str = "default"
    roles: Sequence[str] | None = None
    """The roles every node of the fleet serves (gymflow.workers.roles); None: the task file's."""
    infra: str | None = None
    """SkyPilot infra, e.g. `aws`, `gcp/us-central1`, `k8s`."""
    cluster: str = DEFAULT_CLUSTER
    task_file: Path = TASK_FILE
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every worker."""
    connection: ClusterCredentials | None = None
    """The resolved cluster connection, whose API key and TLS files the workers get as secrets and
    file mounts (address and namespace go as GYMFLOW_TEMPORAL_ADDRESS / GYMFLOW_NAMESPACE)."""


TLS_DIR = "~/.gymflow/tls"
"""Where each node finds the TLS files of the fleet's connection (SkyPilot file mounts)."""


def credentials(connection: ClusterCredentials) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(envs, secrets, file mounts) that give a node `connection`'s credentials.

    TLS files are mounted under TLS_DIR and named by TEMPORAL_TLS_*_PATH (the run script expands
    `~`); an API key and inline TLS data are secrets; `TEMPORAL_TLS=true` says TLS is on.
    """
    envs: dict[str, str] = {}
    secrets: dict[str, str] = {}
    mounts: dict[str, str] = {}
    for name, value in connection.environment().items():
        if name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE"):
            continue  # as GYMFLOW_TEMPORAL_ADDRESS / GYMFLOW_NAMESPACE
        if name.endswith("_PATH"):
            remote = f"{TLS_DIR}/{name.removeprefix('TEMPORAL_TLS_').removesuffix('_PATH').lower()}.pem"
            mounts[remote] = value
            envs[name] = remote
        elif name in ("TEMPORAL_TLS", "TEMPORAL_TLS_SERVER_NAME"):
            envs[name] = value
        else:  # the API key, inline certificates and keys, gRPC metadata (often a credential too)
            secrets[name] = value
    return envs, secrets, mounts


@dataclass
class LocalNode:
    """A worker started by the local backend."""

    rank: int
    pid: int
    log: Path


def task_config(spec: FleetSpec, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The task YAML with the fleet's settings applied and secret values taken from `environ`.

    Raises:
        ValueError: `nodes` is not positive, or the task file is not a SkyPilot task mapping.
    """
    if spec.nodes < 1:
        raise ValueError(f"--nodes must be at least 1, got {spec.nodes}")
    environ = os.environ if environ is None else environ
    config = yaml.safe_load(spec.task_file.read_text())
    if not isinstance(config, dict) or not isinstance(config.get("run"), str):
        raise ValueError(f"{spec.task_file}: not a SkyPilot task with a 'run' script")  # noqa: TRY004
    config["num_nodes"] = spec.nodes
    if spec.infra:
        config["resources"] = {**(config.get("resources") or {}), "infra": spec.infra}
    config["envs"] = {
        **(config.get("envs") or {}),
        "GYMFLOW_TEMPORAL_ADDRESS": spec.temporal_address,
        "GYMFLOW_TASK_QUEUE": spec.task_queue,
        "GYMFLOW_NAMESPACE": spec.namespace,
        **({"GYMFLOW_WORKER_ROLES": ",".join(spec.roles)} if spec.roles else {}),
        **spec.env,
    }
    secrets = {name: environ.get(name) for name in config.get("secrets") or {}}
    config["secrets"] = {name: value for name, value in secrets.items() if value}
    if spec.connection is not None:
        envs, connection_secrets, mounts = credentials(spec.connection)
        config["envs"].update(envs)
        config["secrets"].update(connection_secrets)
        if mounts:
            config["file_mounts"] = {**(config.get("file_mounts") or {}), **mounts}
    if not config["secrets"]:
        config.pop("secrets")
    return config


def render(config: Mapping[str, Any]) -> str:
    """The task as YAML, secret values redacted (what `--dryrun` prints)."""
    shown = dict(config)
    if "secrets" in shown:
        shown["secrets"] = dict.fromkeys(shown["secrets"], "<redacted>")
    return yaml.dump(shown, Dumper=_BlockDumper, sort_keys=False)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the setup and run scripts) as readable `|` blocks."""


def _block_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _block_str)


def launch_skypilot(spec: FleetSpec) -> Any:
    """Launch (or update) the SkyPilot cluster and start a worker on each node; returns the job id."""
    sky = import_sky()
    task = sky.Task.from_yaml_config(task_config(spec))
    request_id = sky.launch(task, cluster_name=spec.cluster)
    job_id, _handle = sky.stream_and_get(request_id)
    return job_id


def down_skypilot(cluster: str = DEFAULT_CLUSTER) -> None:
    """Tear the SkyPilot cluster down."""
    sky = import_sky()
    sky.stream_and_get(sky.down(cluster))


def launch_local(spec: FleetSpec, *, data_dir: Path, workdir: Path | None = None) -> list[LocalNode]:
    """Run the task's `run` script as `spec.nodes` local processes (setup is skipped).

    Raises:
        RuntimeError: Local workers recorded in `data_dir` are still running.
    """
    config = task_config(spec)
    state = data_dir / "workers"
    if running := _live_records(state):
        raise RuntimeError(
            f"{len(running)} local worker(s) already running (pids {', '.join(str(r['pid']) for r in running)}); "
            "stop them with `gymflow deploy down --backend local`"
        )
    state.mkdir(parents=True, exist_ok=True)
    mounts = {remote: local for remote, local in (config.get("file_mounts") or {}).items()}
    base_env = {
        **os.environ,
        # A local node reads the files where they are: no copy under TLS_DIR.
        **{k: str(mounts.get(str(v), v)) for k, v in (config.get("envs") or {}).items()},
        **config.get("secrets", {}),
        # This interpreter's scripts first, so the script's bare `gymflow` is this installation.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    cwd = workdir or Path.cwd()
    nodes = []
    for rank in range(spec.nodes):
        log = state / f"rank-{rank}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                ["bash", "-c", config["run"]],
                cwd=cwd,
                env={**base_env, "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": str(spec.nodes)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        record = {"rank": rank, "pid": process.pid, "start": start_time(process.pid), "log": str(log)}
        (state / f"rank-{rank}.json").write_text(json.dumps(record))
        nodes.append(LocalNode(rank=rank, pid=process.pid, log=log))
    return nodes


def down_local(*, data_dir: Path, ranks: list[int] | None = None, timeout_s: float = STOP_TIMEOUT_S) -> list[int]:
    """Stop local workers (SIGTERM: a graceful shutdown, then SIGKILL); returns the pids stopped."""
    state = data_dir / "workers"
    stopped = []
    for record in _live_records(state):
        if ranks is not None and record["rank"] not in ranks:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record["pid"], signal.SIGTERM)
        stopped.append(record["pid"])
    _wait_gone(stopped, timeout_s)
    for pid in stopped:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    _wait_gone(stopped, KILL_CONFIRM_S)  # a SIGKILLed process still takes a moment to go
    for path in state.glob("rank-*.json"):
        record = json.loads(path.read_text())
        if ranks is None or record["rank"] in ranks:
            path.unlink(missing_ok=True)
    return stopped


def _live_records(state: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(state.glob("rank-*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            # A pid reused by another process has another start time: not ours to signal.
            if start_time(record["pid"]) == record["start"]:
                records.append(record)
    return records


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
