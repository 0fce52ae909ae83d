"""The multi-node fixture's network (bench/netns.py), fast: namespaces linked to a host bridge,
a partition that cuts exactly one node off and heals, and nothing left behind.

The fleets that run workers on it (tests/chaos/test_partition.py, bench/partition.py) are slow;
this shows the links they stand on, in a few seconds.
"""

from __future__ import annotations

import socket
import subprocess

import pytest

from bench.netns import Network, unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces here: {REASON}")


def test_nodes_reach_the_host_until_partitioned_and_leave_nothing_behind() -> None:
    network = Network(3).create()
    try:
        with socket.socket() as listener:
            listener.bind((network.host_address, 0))  # the bridge address only, as the fleet's server
            listener.listen()
            port = listener.getsockname()[1]
            assert all(network.reachable(i, network.host_address, port) for i in range(3))
            network.partition(1)
            assert not network.reachable(1, network.host_address, port, timeout_s=1.0)
            assert network.reachable(0, network.host_address, port) and network.reachable(2, network.host_address, port)
            network.heal(1)
            assert network.reachable(1, network.host_address, port)
            # The namespaces reach nothing but the bridge: no route off the subnet.
            assert not network.reachable(0, "127.0.0.1", port, timeout_s=1.0)
    finally:
        names = [ns.name for ns in network.namespaces]
        links = [ns.host_link for ns in network.namespaces] + [network.bridge]
        network.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(name in listed for name in names)
    shown = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert not any(f" {link}" in shown or f"{link}@" in shown for link in links)
