"""A test's own network: a cut link drops packets without a word (no FIN, no RST, no refusal),
a healed one carries the same connection on, and nothing of the network outlives it."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys

import pytest

from aegis_devstack.testing import netlab

pytestmark = pytest.mark.integration

# an echo server on argv[1]:argv[2], one connection at a time
ECHO = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        while data := conn.recv(1024):
            conn.sendall(data)
"""


@pytest.fixture(scope="module")
def usable() -> None:
    reason = netlab.unavailable()
    if reason is not None:
        pytest.skip(reason)


def _names(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@pytest.mark.usefixtures("usable")
def test_a_cut_link_drops_packets_silently_and_a_healed_one_carries_the_connection_on() -> None:
    with netlab.open_network() as network:
        host = network.host("echo")
        network.join()
        assert ipaddress.IPv4Address(host.address) in network.subnet
        server = subprocess.Popen(
            [*host.prefix, sys.executable, "-c", ECHO, host.address, "7000"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdout.readline() == "listening\n"
            conn = socket.create_connection((host.address, 7000), timeout=2)
            conn.sendall(b"before")
            assert conn.recv(1024) == b"before"

            network.cut(host)
            conn.settimeout(1.0)
            conn.sendall(b"during")
            # neither an answer nor an end (b"") nor a reset: silence
            with pytest.raises(TimeoutError):
                conn.recv(1024)
            # a new connection is not refused either: it goes unanswered
            with pytest.raises(TimeoutError):
                socket.create_connection((host.address, 7000), timeout=1.0)

            network.heal(host)
            conn.settimeout(10.0)  # the retransmission comes after its backoff
            assert conn.recv(1024) == b"during"
            conn.close()
        finally:
            server.kill()
            server.communicate(timeout=5)
        namespaces = [host.namespace, network.hub]
        joined = network.joined
    listed = _names(["ip", "netns", "list"])
    assert not [name for name in namespaces if name in listed]
    assert joined is not None and joined not in _names(["ip", "-o", "link"])


@pytest.mark.usefixtures("usable")
def test_a_network_takes_a_private_24_no_route_of_the_machine_overlaps() -> None:
    with netlab.open_network() as network:
        address = network.join()
        assert network.subnet.prefixlen == 24 and network.subnet.is_private
        assert address == str(network.subnet.network_address + 1)
        routes = _names(["ip", "-4", "-o", "route"])
        # the one route of the subnet is the network's own link
        assert [line for line in routes.splitlines() if str(network.subnet) in line] == [
            line for line in routes.splitlines() if network.joined and network.joined in line
        ]
    assert str(network.subnet) not in _names(["ip", "-4", "-o", "route"])
