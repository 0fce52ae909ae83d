"""Per-rollout networks: an internal bridge each, from gymflow's own address pool, cut off from the host.

A rollout with services (gymflow.envs.runtime.compose) gets a network of its own, on which its
containers reach each other and nothing else:

* Addresses. An engine hands out a /16 or /20 of its default pools per network and runs out after a
  few dozen networks; 64+ concurrent rollouts a node need more. Each network is created with an
  explicit `--subnet`, a /28 (13 containers) of gymflow's pool, `GYMFLOW_NETWORK_POOL` (default
  10.213.0.0/16). The pool is split in two halves, podman's and docker's, so the two engines of one
  node never pick the same subnet (neither sees the other's networks, and podman only creates its
  bridge, and with it the host route, when a container first joins). A subnet is picked at random
  among those no network of the engine and no host route uses, so worker processes racing for one
  rarely collide; the one that loses gets the engine's overlap error and tries another.
* No route out: `--internal` (no default route, no NAT). What remains reachable is the host itself,
  through the bridge's address (the gateway): `isolate` loads iptables rules into each container's
  own network namespace (`nsenter -t PID -n`, as gymflow.envs.runtime.egress does) that allow the
  network's subnet but not its gateway, loopback and replies, and reject all else (IPv6 whole). The
  rules leave with the container, and the container, without CAP_NET_ADMIN, cannot change them.
* Names: every container gets `--add-host` entries for the services' fixed addresses (`--ip`), so a
  service is found by its name without the engine's DNS, which on podman answers on the gateway.
* Labels (`gymflow=1`, node, rollout, owner) so that `networks` and `remove_networks` let the reaper
  find and remove what a dead worker left.

Engine differences (the flags of `network create`/`rm`/`ls` are the same; `network inspect` prints
netavark's lowercase JSON on podman, the Docker API's on docker) are handled here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from gymflow.envs.errors import EngineError, SandboxError
from gymflow.envs.runtime import egress
from gymflow.envs.runtime.engine import LABEL_MARKER, Engine

POOL_ENV = "GYMFLOW_NETWORK_POOL"
"""The IPv4 range rollout networks are cut from (a CIDR)."""
DEFAULT_POOL = "10.213.0.0/16"
SUBNET_PREFIX = 28
"""A /28: 16 addresses, 13 for containers (network, gateway and broadcast taken)."""
NAME_PREFIX = "gymflow-net-"
CREATE_ATTEMPTS = 20
ENGINE_TIMEOUT_S = 60.0
RULES_TIMEOUT_S = 30.0
_OVERLAP = ("overlap", "already used", "already in use")
_USED_TTL_S = 2.0


@dataclass(frozen=True)
class NetworkInfo:
    """A network as the engine lists it."""

    name: str
    subnets: tuple[IPv4Network, ...]
    labels: dict[str, str]


@dataclass(frozen=True)
class RolloutNetwork:
    """A rollout's network: its name, its /28 and the gateway (the host's address on it)."""

    name: str
    subnet: IPv4Network
    gateway: IPv4Address

    def addresses(self) -> Iterator[IPv4Address]:
        """The container addresses, in order (the gateway excluded)."""
        return (a for a in self.subnet.hosts() if a != self.gateway)

    def rules(self) -> str:
        """The iptables-restore input of a member container's filter table."""
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        lines += ["-A OUTPUT -o lo -j ACCEPT", "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
        lines += [f"-A OUTPUT -d {self.gateway}/32 -j REJECT", f"-A OUTPUT -d {self.subnet} -j ACCEPT"]
        lines += ["-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset", "-A OUTPUT -j REJECT", "COMMIT", ""]
        return "\n".join(lines)


@dataclass
class _Used:
    """Subnets this process knows are taken: the engine's and the host's (refreshed when stale) and its own."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    listed: set[IPv4Network] = field(default_factory=set)
    listed_at: float = float("-inf")
    reserved: set[IPv4Network] = field(default_factory=set)


_used: dict[tuple[str, int], _Used] = {}


def pool(engine: Engine, configured: str | None = None) -> IPv4Network:
    """This engine's half of the pool (`configured`, else `GYMFLOW_NETWORK_POOL`, else the default).

    Raises:
        SandboxError: The pool is not an IPv4 CIDR with room for two /28s.
    """
    text = configured or os.environ.get(POOL_ENV) or DEFAULT_POOL
    try:
        whole = IPv4Network(text, strict=False)
    except ValueError as exc:
        raise SandboxError(f"{POOL_ENV}={text!r} is not an IPv4 network: {exc}") from None
    if whole.prefixlen >= SUBNET_PREFIX:
        raise SandboxError(f"{POOL_ENV}={text!r} is too small: it must hold at least two /{SUBNET_PREFIX}s")
    low, high = whole.subnets(prefixlen_diff=1)
    return low if engine.kind == "podman" else high


async def create_network(
    engine: Engine, *, labels: Mapping[str, str], pool_cidr: str | None = None, timeout_s: float = ENGINE_TIMEOUT_S
) -> RolloutNetwork:
    """Create an internal network with a free /28 of the pool and `labels` (plus `gymflow=1`).

    Raises:
        SandboxError: The pool is full, or the engine refused every subnet tried, or failed.
    """
    candidates = list(pool(engine, pool_cidr).subnets(new_prefix=SUBNET_PREFIX))
    used = _used.setdefault((engine.binary, id(asyncio.get_running_loop())), _Used())
    name = f"{NAME_PREFIX}{uuid.uuid4().hex[:12]}"
    flags = [arg for key, value in {LABEL_MARKER: "1", **labels}.items() for arg in ("--label", f"{key}={value}")]
    last = ""
    for _ in range(CREATE_ATTEMPTS):
        async with used.lock:
            if time.monotonic() - used.listed_at > _USED_TTL_S:
                used.listed = await _taken(engine, timeout_s)
                used.listed_at = time.monotonic()
            taken = used.listed | used.reserved
            free = [s for s in candidates if not any(s.overlaps(t) for t in taken)]
            if not free:
                raise SandboxError(f"no free /{SUBNET_PREFIX} left in the network pool {pool(engine, pool_cidr)}")
            subnet = random.choice(free)
            used.reserved.add(subnet)
        gateway = next(subnet.hosts())
        args = ["network", "create", "--driver", "bridge", "--internal", "--subnet", str(subnet)]
        args += ["--gateway", str(gateway), *flags, name]
        try:
            done = await engine.run(args, timeout_s=timeout_s, check=False)
        except BaseException:
            used.reserved.discard(subnet)
            await remove_networks(engine, [name])  # a create that timed out may still have happened
            raise
        if done.returncode == 0:
            return RolloutNetwork(name, subnet, gateway)
        used.reserved.discard(subnet)
        last = (done.stderr.strip() or done.stdout.strip())[-500:]
        if not any(word in last.lower() for word in _OVERLAP):
            raise SandboxError(f"`{engine.kind} network create` failed: {last}")
        async with used.lock:
            used.listed.add(subnet)
            used.listed_at = float("-inf")
    raise SandboxError(f"no network after {CREATE_ATTEMPTS} subnets of the pool were taken: {last}")


def forget(engine: Engine, network: RolloutNetwork) -> None:
    """Let this process hand out `network`'s subnet again (it was removed)."""
    for (binary, _), used in _used.items():
        if binary == engine.binary:
            used.reserved.discard(network.subnet)
            used.listed.discard(network.subnet)


async def networks(
    engine: Engine, labels: Mapping[str, str], *, timeout_s: float = ENGINE_TIMEOUT_S
) -> list[NetworkInfo]:
    """Every network carrying all of `labels` (for the reaper: e.g. `{gymflow: 1, gymflow.node: ...}`)."""
    filters = [arg for key, value in labels.items() for arg in ("--filter", f"label={key}={value}")]
    return await _inspect(engine, await _names(engine, filters, timeout_s), timeout_s)


async def remove_networks(engine: Engine, names: Sequence[str], *, timeout_s: float = ENGINE_TIMEOUT_S) -> None:
    """Remove networks (gone already is fine). Their containers must be removed first.

    Raises:
        SandboxError: Some are still there (the message names them and the engine's reason).
    """
    if not names:
        return
    done = await engine.run(["network", "rm", *names], timeout_s=timeout_s, check=False)
    if done.returncode == 0:
        return
    left = await _names(engine, [], timeout_s)
    still = [n for n in names if n in left]
    if still:
        tail = (done.stderr.strip() or done.stdout.strip())[-500:]
        raise SandboxError(f"networks not removed: {', '.join(still)}: {tail}")


async def isolate(pid: int, network: RolloutNetwork) -> None:
    """Load `network`'s rules into the network namespace of process `pid` (a member container's init).

    Raises:
        SandboxError: nsenter or iptables-restore is missing, or the load failed.
    """
    missing = egress.missing_tools()
    if missing:
        raise SandboxError(f"rollout networks need {', '.join(missing)} on the node: {egress.INSTALL_HINT}")
    loads = [("iptables-restore", network.rules())]
    if shutil.which("ip6tables-restore") is not None:
        loads.append(("ip6tables-restore", egress.REFUSE_ALL_V6))
    for tool, text in loads:
        process = await asyncio.create_subprocess_exec(
            "nsenter", "-t", str(pid), "-n", tool, "-w",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(process.communicate(text.encode()), RULES_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise SandboxError(f"{tool} in the namespace of pid {pid} timed out") from None
        if process.returncode != 0:
            raise SandboxError(f"{tool} in the namespace of pid {pid} failed: {out.decode(errors='replace')[-500:]}")


async def _names(engine: Engine, filters: list[str], timeout_s: float) -> list[str]:
    listed = await engine.run(["network", "ls", *filters, "--format", "{{.Name}}"], timeout_s=timeout_s)
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


async def _inspect(engine: Engine, names: list[str], timeout_s: float) -> list[NetworkInfo]:
    if not names:
        return []
    done = await engine.run(["network", "inspect", *names], timeout_s=timeout_s, check=False)
    try:
        items = _json_list(done.stdout)
    except ValueError as exc:
        raise EngineError(f"`{engine.kind} network inspect` printed no JSON: {exc}") from None
    return [_info(item) for item in items if isinstance(item, dict)]


def _json_list(text: str) -> list[Any]:
    value = json.loads(text or "[]")
    return value if isinstance(value, list) else []


def _info(item: dict[str, Any]) -> NetworkInfo:
    """podman (netavark: `subnets: [{subnet}]`, `labels`) or docker (`IPAM.Config: [{Subnet}]`, `Labels`)."""
    if "IPAM" in item or "Name" in item:
        configs = (item.get("IPAM") or {}).get("Config") or []
        cidrs = [c.get("Subnet", "") for c in configs]
        name, labels = item.get("Name", ""), item.get("Labels") or {}
    else:
        cidrs = [s.get("subnet", "") for s in item.get("subnets") or []]
        name, labels = item.get("name", ""), item.get("labels") or {}
    subnets = []
    for cidr in cidrs:
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            continue
        if isinstance(net, IPv4Network):
            subnets.append(net)
    return NetworkInfo(str(name), tuple(subnets), {str(k): str(v) for k, v in labels.items()})


async def _taken(engine: Engine, timeout_s: float) -> set[IPv4Network]:
    """The subnets of every network of the engine and of every host route."""
    infos = await _inspect(engine, await _names(engine, [], timeout_s), timeout_s)
    return {s for info in infos for s in info.subnets} | await asyncio.to_thread(_host_routes)


def _host_routes() -> set[IPv4Network]:
    """The host's IPv4 routes (/proc/net/route: little-endian hex destination and mask), the default one left out."""
    routes: set[IPv4Network] = set()
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return routes
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        dest, mask = (IPv4Address(int(x, 16).to_bytes(4, "little")) for x in (fields[1], fields[7]))
        if int(mask):
            routes.add(IPv4Network(f"{dest}/{mask}", strict=False))
    return routes
