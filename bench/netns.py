"""A multi-node fleet on one machine: worker nodes in network namespaces, linked to the host by veth pairs.

Killing a process is how one machine usually fakes a lost node. The common cloud failure is
another: the node is alive, its MCP servers run and its activities go on executing, but it cannot
reach the Temporal server (a partition). `Network` builds that for real with iproute2 (as root):

    host:  bridge gf<id>br  10.213.K.1/24   <- nodes reach the Temporal server and the policy here
             |- veth gf<id>h0 ==== gf<id>n0  10.213.K.10  in namespace gf<id>-n0  <- node 0
             |- veth gf<id>h1 ==== gf<id>n1  10.213.K.11  in namespace gf<id>-n1  <- node 1
             ...

Each node's processes (a `gymflow worker` and the MCP servers it starts) live in the node's
namespace and reach the host only over its veth. `partition(i)` sets the host end of node i's
link down (its TCP connections stall, nothing is reset, exactly as behind a failed switch or a
security group change); `heal(i)` sets it up again. Traffic goes only to these addresses and
loopback; `close()` kills what runs in the namespaces and deletes the namespaces, links and the
bridge (deleting a namespace deletes its veth pair).

`FleetNodes` runs one `gymflow worker` per namespace against a server on the bridge address:
the tests (tests/chaos/test_partition.py) and the benchmark (bench/partition.py) share it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SUBNET_PREFIX = "10.213"
"""Namespaces get a /24 of 10.213.0.0/16 that no route of the host uses."""
NODE_HOST = 10
"""Node i's address is <subnet>.(NODE_HOST + i)."""


def start_server(network: Network, data_dir: Path, *, port: int) -> tuple[subprocess.Popen[bytes], str]:
    """The Temporal dev server (as `gymflow server` runs it, headless); returns the process and the
    address nodes dial (the bridge address). The host's own clients may use 127.0.0.1:port.

    It listens on every interface: `start-dev --ip ADDR` binds its internal services to ADDR but
    dials them on 127.0.0.1 (temporal CLI 1.9), so a server bound to the bridge address alone fails.
    """
    from gymflow.workers.servers.temporal import dev_server_command

    data_dir.mkdir(parents=True, exist_ok=True)
    command = dev_server_command(data_dir=data_dir, port=port, ui_port=port + 1, headless=True)
    command += ["--ip", "0.0.0.0"]
    with (data_dir / "server.log").open("ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return process, f"{network.host_address}:{port}"


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, or no iproute2)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed: apt-get install iproute2"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"gfprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> str:
    used = _ip("-4", "addr").stdout + _ip("-4", "route").stdout
    candidates = list(range(1, 255))
    random.shuffle(candidates)
    for k in candidates:
        if f"{SUBNET_PREFIX}.{k}." not in used:
            return f"{SUBNET_PREFIX}.{k}"
    raise NetnsUnavailable(f"no free /24 in {SUBNET_PREFIX}.0.0/16")


@dataclass
class Namespace:
    """One node's network namespace and the veth pair that links it to the host bridge."""

    index: int
    name: str
    host_link: str
    node_link: str
    address: str
    partitioned: bool = False


@dataclass
class Network:
    """A bridge on the host and `nodes` namespaces linked to it (see the module docstring)."""

    nodes: int
    prefix: str = field(default_factory=lambda: f"gf{uuid.uuid4().hex[:4]}")
    subnet: str = ""
    namespaces: list[Namespace] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def host_address(self) -> str:
        """The host's address on the bridge: where the server and the policy endpoint listen."""
        return f"{self.subnet}.1"

    def create(self) -> Network:
        """Make the bridge, namespaces and links (undone by `close`, also after a partial failure)."""
        reason = unavailable()
        if reason is not None:
            raise NetnsUnavailable(reason)
        self.subnet = _free_subnet()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.nodes):
                ns = Namespace(
                    index=i,
                    name=f"{self.prefix}-n{i}",
                    host_link=f"{self.prefix}h{i}",
                    node_link=f"{self.prefix}n{i}",
                    address=f"{self.subnet}.{NODE_HOST + i}",
                )
                self.namespaces.append(ns)
                _ip("netns", "add", ns.name)
                _ip("link", "add", ns.host_link, "type", "veth", "peer", "name", ns.node_link)
                _ip("link", "set", ns.host_link, "master", self.bridge)
                _ip("link", "set", ns.host_link, "up")
                _ip("link", "set", ns.node_link, "netns", ns.name)
                _ip("-n", ns.name, "addr", "add", f"{ns.address}/24", "dev", ns.node_link)
                _ip("-n", ns.name, "link", "set", ns.node_link, "up")
                _ip("-n", ns.name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def partition(self, index: int) -> None:
        """Cut node `index` off: the host end of its link goes down."""
        ns = self.namespaces[index]
        _ip("link", "set", ns.host_link, "down")
        ns.partitioned = True

    def heal(self, index: int) -> None:
        """Link node `index` again."""
        ns = self.namespaces[index]
        _ip("link", "set", ns.host_link, "up")
        ns.partitioned = False

    def pids(self, index: int) -> list[int]:
        """Processes in node `index`'s namespace."""
        out = _ip("netns", "pids", self.namespaces[index].name, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def command(self, index: int, argv: list[str]) -> list[str]:
        """`argv` run inside node `index`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[index].name, *argv]

    def reachable(self, index: int, address: str, port: int, timeout_s: float = 2.0) -> bool:
        """Whether a TCP connection from inside node `index` to address:port succeeds."""
        probe = (
            "import socket,sys\n"
            f"try: socket.create_connection(({address!r}, {port}), timeout={timeout_s}).close()\n"
            "except OSError: sys.exit(1)\n"
        )
        argv = self.command(index, [sys.executable, "-c", probe])
        done = subprocess.run(argv, check=False, capture_output=True, timeout=30)
        return done.returncode == 0

    def close(self) -> None:
        """Kill what still runs in the namespaces; delete the namespaces, links and the bridge."""
        for ns in self.namespaces:
            for pid in self.pids(ns.index):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            _ip("netns", "del", ns.name, check=False)
            _ip("link", "del", ns.host_link, check=False)  # gone with the namespace, unless it was never moved
        _ip("link", "del", self.bridge, check=False)
        self.namespaces.clear()


def process_count(network: Network, index: int, marker: str) -> int:
    """Processes in node `index` whose command line contains `marker` (its MCP servers, say)."""
    count = 0
    for pid in network.pids(index):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        count += marker in cmdline
    return count


@dataclass
class FleetNodes:
    """One `gymflow worker` per namespace of `network`, dialing the server at `address`."""

    network: Network
    address: str
    task_queue: str
    root: Path
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra variables for every worker (GYMFLOW_* settings)."""
    metrics_port: int = 9464
    """Each node serves /metrics on its own address at this port."""
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def node_id(self, index: int) -> str:
        return f"{self.network.prefix}-node{index}"

    def log(self, index: int) -> Path:
        return self.root / f"node{index}.log"

    def metrics_url(self, index: int) -> str:
        return f"http://{self.network.namespaces[index].address}:{self.metrics_port}/metrics"

    def start(self, index: int) -> int:
        """Start node `index`'s worker inside its namespace; returns its pid."""
        self.root.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "GYMFLOW_TEMPORAL_ADDRESS": self.address,
            "GYMFLOW_TASK_QUEUE": self.task_queue,
            "GYMFLOW_NODE_ID": self.node_id(index),
            "GYMFLOW_WORKSPACE_ROOT": str(self.root / "ws"),
            "GYMFLOW_DATA_DIR": str(self.root / f"data{index}"),
            "GYMFLOW_METRICS_PORT": str(self.metrics_port),
            "GYMFLOW_METRICS_HOST": self.network.namespaces[index].address,
            **self.env,
        }
        argv = [sys.executable, "-m", "gymflow.workers.cli", "--log-format", "json", "worker"]
        with self.log(index).open("ab") as out:
            process = subprocess.Popen(
                self.network.command(index, argv), env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.processes[index] = process
        return process.pid

    def start_all(self) -> None:
        for ns in self.network.namespaces:
            self.start(ns.index)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every worker (a graceful stop frees its servers), SIGKILL after `timeout_s`."""
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
