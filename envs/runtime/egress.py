"""A container's egress allowlist (`Limits.network_allow`): rules in the container's own network namespace.

A container with an allowlist runs on the engine's network; before the runtime hands it to anyone,
gymflow enters its network namespace from the host (`nsenter -t PID -n`) and loads an iptables
OUTPUT chain into it: loopback and replies accepted, a TCP connection to each allowed address (and
port) accepted, everything else refused (REJECT, so a tool fails at once instead of hanging; IPv6
refused whole). The rules live in the container's namespace, not the host's: nothing on the node
changes, and they leave with the container. The container cannot change them: podman gives it no
CAP_NET_ADMIN, and it runs with no-new-privileges.

Names are resolved on the worker when the container starts (IPv4) and written to the container's
/etc/hosts (`--add-host`): DNS itself is not allowed unless a resolver's address is listed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import socket
from dataclasses import dataclass

from gymflow.envs.errors import SandboxError

INSTALL_HINT = "apt-get install iptables util-linux"
"""What installs the tools on a Debian node (iptables-restore; nsenter is util-linux's)."""


@dataclass(frozen=True)
class Destination:
    """One allowed destination: an IPv4 address, a TCP port (None: any), and the name it came from."""

    address: str
    port: int | None
    name: str | None = None


def parse(entry: str) -> tuple[str, int | None]:
    """`host:port` or `host` -> (host, port or None)."""
    host, sep, port = entry.rpartition(":")
    return (host, int(port)) if sep else (entry, None)


async def resolve(entries: list[str]) -> list[Destination]:
    """Every entry's IPv4 addresses; a name that does not resolve is a SandboxError naming it."""
    loop = asyncio.get_running_loop()
    destinations: list[Destination] = []
    for entry in entries:
        host, port = parse(entry)
        try:
            destinations.append(Destination(str(ipaddress.IPv4Address(host)), port))
            continue
        except ValueError:
            pass
        try:
            infos = await loop.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise SandboxError(f"network_allow: cannot resolve {host!r} on this node: {exc}") from exc
        for address in sorted({str(info[4][0]) for info in infos}):
            destinations.append(Destination(address, port, name=host))
    return destinations


def host_flags(destinations: list[Destination]) -> list[str]:
    """`--add-host name:address` for every name, so the container finds them without DNS."""
    seen: dict[str, str] = {}
    for d in destinations:
        if d.name is not None:
            seen.setdefault(d.name, d.address)
    return [arg for name, address in seen.items() for arg in ("--add-host", f"{name}:{address}")]


def rules(destinations: list[Destination]) -> str:
    """The iptables-restore input of the container's filter table (IPv4)."""
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    lines += ["-A OUTPUT -o lo -j ACCEPT", "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
    for d in destinations:
        port = f" -m tcp --dport {d.port}" if d.port is not None else ""
        lines.append(f"-A OUTPUT -d {d.address}/32 -p tcp{port} -j ACCEPT")
    lines += ["-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset", "-A OUTPUT -j REJECT", "COMMIT", ""]
    return "\n".join(lines)


REFUSE_ALL_V6 = (
    "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
    "-A OUTPUT -o lo -j ACCEPT\n-A OUTPUT -j REJECT\nCOMMIT\n"
)


def missing_tools() -> list[str]:
    """The host tools an allowlist needs that this node lacks."""
    return [tool for tool in ("nsenter", "iptables-restore") if shutil.which(tool) is None]


async def apply(pid: int, destinations: list[Destination]) -> None:
    """Load the allowlist into the network namespace of process `pid` (the container's init)."""
    missing = missing_tools()
    if missing:
        raise SandboxError(f"network_allow needs {', '.join(missing)} on the node: {INSTALL_HINT}")
    loads = [("iptables-restore", rules(destinations))]
    if shutil.which("ip6tables-restore") is not None:
        loads.append(("ip6tables-restore", REFUSE_ALL_V6))
    for tool, text in loads:
        process = await asyncio.create_subprocess_exec(
            "nsenter", "-t", str(pid), "-n", tool, "-w",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(process.communicate(text.encode()), timeout=30)
        if process.returncode != 0:
            raise SandboxError(f"network_allow: {tool} in the container's namespace failed: {out.decode()[-500:]}")
