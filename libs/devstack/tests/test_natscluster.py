"""The tests' NATS cluster (aegis_devstack.testing.natscluster) starts with all its nodes, even when
a port drawn for one is taken before the node binds it: that start is made again on new ports,
instead of a cluster short of a node whose port another server answers."""

from __future__ import annotations

import itertools
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aegis_devstack.localservers import free_port, wait_for_port
from aegis_devstack.testing import natscluster
from aegis_devstack.testing.natscluster import NatsCluster, nats_server_binary, start_cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(nats_server_binary() is None, reason="nats-server is not installed"),
]

PASSWORDS = {"admin": "admin-pw", "ingest": "ingest-pw"}
N2_CLIENT, N3_ROUTE = 2, 5  # the draws of a start: (client, route) for n1, n2, n3


def taking(port: int, draw: int, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Make the ``draw``-th port the cluster draws be ``port``; returns how many it drew."""
    draws = itertools.count()
    monkeypatch.setattr(
        natscluster, "free_port", lambda: port if next(draws) == draw else free_port()
    )
    return lambda: next(draws)


@pytest.fixture
def cluster_of(tmp_path: Path) -> Iterator[Callable[[], NatsCluster]]:
    started: list[NatsCluster] = []

    def start() -> NatsCluster:
        started.append(start_cluster(tmp_path / "cluster", PASSWORDS))
        return started[-1]

    yield start
    for cluster in started:
        cluster.stop()


def assert_whole(cluster: NatsCluster, taken: int) -> None:
    assert [node.name for node in cluster.nodes] == ["n1", "n2", "n3"]
    for node in cluster.nodes:
        assert node.server.process is not None and node.server.process.poll() is None
        assert node.port != taken
    cluster.wait_for_jetstream(10)


def test_a_node_whose_client_port_another_jetstream_server_took_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster_of: Callable[[], NatsCluster]
) -> None:
    port = free_port()
    store = str(tmp_path / "other")
    other = subprocess.Popen(
        [str(nats_server_binary()), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, 10)
        drawn = taking(port, N2_CLIENT, monkeypatch)
        cluster = cluster_of()
        assert_whole(cluster, port)
        assert drawn() == 12  # two starts of six ports each
        assert other.poll() is None  # the other server was left alone
    finally:
        other.terminate()
        other.wait(10)


def test_a_node_whose_route_port_was_taken_is_started_again(
    monkeypatch: pytest.MonkeyPatch, cluster_of: Callable[[], NatsCluster]
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        drawn = taking(port, N3_ROUTE, monkeypatch)
        cluster = cluster_of()
        assert_whole(cluster, port)
        assert drawn() == 12
