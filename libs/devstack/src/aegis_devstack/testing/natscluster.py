"""A JetStream cluster of local nats-servers for tests of replicated streams: each node with its
own client port, route port and store, natsauth's identities on every node (as a deployment's
cluster has them), and nodes that can be killed like a crash and brought back with their store.
The nodes run on 127.0.0.1, or each on a host of a test's own network
(:mod:`aegis_devstack.testing.netlab`), where a test can cut one off from the others.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aegis_cli.natsauth import server_authorization
from aegis_contracts.bus import ADMIN
from aegis_devstack.localservers import (
    NATS_SERVER,
    LocalServerError,
    ManagedServer,
    free_port,
    jetstream_account_info,
    port_open,
    start_managed_server,
)
from aegis_devstack.testing.natsbus import TEST_BCRYPT_COST
from aegis_devstack.testing.netlab import Host
from aegis_runtime.settings import AegisSettings

__all__ = ["NatsCluster", "Node", "nats_server_binary", "start_cluster"]

# run on a node's host: print what an HTTP GET of argv[1] answers (timeout argv[2])
_FETCH = (
    "import sys, urllib.request\n"
    "with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as answer:\n"
    "    sys.stdout.write(answer.read().decode())\n"
)


def nats_server_binary() -> str | None:
    """The machine's nats-server, or None when it is not installed."""
    found = shutil.which("nats-server")
    if found is None and Path(NATS_SERVER).exists():
        found = NATS_SERVER
    return found


@dataclass
class Node:
    """One server of the cluster; ``name`` is its JetStream server name (what stream info calls
    the leader and the replicas). ``host`` is its address, ``place`` the network host it runs
    on (None: this machine's loopback), ``monitor_port`` its HTTP monitoring port, if any."""

    name: str
    port: int
    server: ManagedServer
    host: str = "127.0.0.1"
    place: Host | None = None
    monitor_port: int | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """Its monitoring endpoint (``/jsz``, ``/routez``), reachable from its own host."""
        if self.monitor_port is None:
            raise LocalServerError(f"{self.name} was started without monitoring")
        return f"http://{self.host}:{self.monitor_port}"

    def monitor(self, path: str, timeout: float = 2.0) -> dict[str, Any]:
        """The JSON its monitoring endpoint answers at ``path``, asked from its own host: a node
        cut off from the rest of the network still says what it believes. Blocking."""
        url = f"{self.monitor_url}{path}"
        if self.place is None:
            with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (http only)
                found: dict[str, Any] = json.loads(answer.read())
                return found
        done = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            [*self.place.prefix, sys.executable, "-c", _FETCH, url, str(timeout)],
            capture_output=True,
            timeout=timeout + 10,
            check=False,
        )
        if done.returncode != 0:
            raise LocalServerError(f"{url} from {self.name}: {done.stderr.decode().strip()}")
        answered: dict[str, Any] = json.loads(done.stdout)
        return answered

    def stream_leader(self, stream: str) -> str | None:
        """The leader of ``stream`` as this node sees it (None: it knows of none)."""
        jsz = self.monitor("/jsz?accounts=true&streams=true")
        for account in jsz.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    leader: str | None = (detail.get("cluster") or {}).get("leader") or None
                    return leader
        return None


@dataclass
class NatsCluster:
    nodes: list[Node]
    passwords: dict[str, str]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated, as ``AEGIS_NATS_URL`` lists a cluster."""
        return ",".join(node.url for node in self.nodes)

    def identity(self, user: str) -> dict[str, Any]:
        """The NATS settings a deployment gives the process of identity ``user``: every node,
        and streams managed by the admin only."""
        return {
            "nats_url": self.url,
            "nats_user": user,
            "nats_password": self.passwords[user],
            "nats_manage_streams": user == ADMIN,
        }

    def settings(self, user: str, **extra: Any) -> AegisSettings:
        return AegisSettings(**(self.identity(user) | extra))

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def wait_for_jetstream(self, timeout: float = 20.0) -> None:
        """Return once every running node answers JetStream API requests (a meta leader is
        elected); :class:`LocalServerError` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        secret = quote(self.passwords[ADMIN], safe="")
        for node in self.nodes:
            if node.server.process is None or node.server.process.poll() is not None:
                continue
            while True:
                try:
                    jetstream_account_info(f"nats://{ADMIN}:{secret}@{node.host}:{node.port}", 1.0)
                    break
                except LocalServerError as err:
                    if time.monotonic() >= deadline:
                        raise LocalServerError(
                            f"JetStream of {node.name} ({node.url}) does not answer after "
                            f"{timeout:g}s: {err}; see {node.server.log_file}"
                        ) from err
                    time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.server.stop()


def start_cluster(
    folder: Path,
    passwords: dict[str, str],
    *,
    size: int = 3,
    name: str = "aegis",
    advertise: bool = False,
    timeout: float = 20.0,
    hosts: Sequence[Host] | None = None,
    monitor: bool = False,
) -> NatsCluster:
    """``size`` nats-servers on free ports of 127.0.0.1, routed to each other, JetStream in
    ``folder/<node>``, and the authorization block of ``passwords`` (``admin`` and identities of
    :mod:`aegis_contracts.bus`). Returns once every node has bound its ports and JetStream
    answers on each.

    A port is drawn free some time before its node binds it, and another test's server may
    take it meanwhile; that node then ends (its log says so) while the port answers for the
    other server. The cluster is then started again on new ports (:data:`PORT_REDRAWS` times at
    most), so a test never runs on a cluster short of a node.

    Like the NATS Helm chart the AWS overlay deploys, the nodes do not tell clients about each
    other (``no_advertise``) unless ``advertise``: clients then know only the URLs they were
    given. ``hosts`` (one per node) runs each node on a host of a test's network instead, at
    its address; ``monitor`` gives each an HTTP monitoring port."""
    binary = nats_server_binary()
    if binary is None:
        raise LocalServerError("nats-server is not installed")
    if hosts is not None and len(hosts) != size:
        raise ValueError(f"{len(hosts)} hosts for {size} nodes")
    places: list[Host | None] = list(hosts) if hosts is not None else [None] * size
    # bcrypt is slow on purpose: one block for every node
    authorization = server_authorization(passwords, cost=TEST_BCRYPT_COST)
    for redraw in range(PORT_REDRAWS + 1):
        cluster = NatsCluster(nodes=[], passwords=dict(passwords))
        try:
            _start_nodes(
                cluster,
                folder,
                binary=binary,
                authorization=authorization,
                places=places,
                name=name,
                advertise=advertise,
                timeout=timeout,
                monitor=monitor,
            )
            _wait_until_each_says_ready(cluster, timeout)
        except LocalServerError:
            cluster.stop()
            homes = [folder / f"n{index}" for index in range(1, size + 1)]
            taken = any(_TAKEN in _read(home / "nats.log") for home in homes)
            if not taken or redraw == PORT_REDRAWS:
                raise
            for home in homes:  # the store of a cluster that never formed: not kept
                shutil.rmtree(home, ignore_errors=True)
        except BaseException:
            cluster.stop()
            raise
        else:
            return cluster
    raise AssertionError("unreachable: the last start returns or raises")


# how often a cluster one of whose ports was taken is started again on new ones
PORT_REDRAWS = 3
# what a node's log says once it listens on all its ports, and when a port of it was taken
_READY = "Server is ready"
_TAKEN = "address already in use"


def _start_nodes(
    cluster: NatsCluster,
    folder: Path,
    *,
    binary: str,
    authorization: str,
    places: list[Host | None],
    name: str,
    advertise: bool,
    timeout: float,
    monitor: bool,
) -> None:
    """Start a node per place on newly drawn ports, and wait for JetStream to answer on each."""
    addresses = [place.address if place else "127.0.0.1" for place in places]
    ports = [(free_port(), free_port()) for _ in places]
    for index, ((port, route_port), place, host) in enumerate(
        zip(ports, places, addresses, strict=True), 1
    ):
        node_name = f"n{index}"
        home = folder / node_name
        home.mkdir(parents=True, exist_ok=True)
        routes = [
            f"nats-route://{other}:{r}"
            for (_, r), other in zip(ports, addresses, strict=True)
            if r != route_port
        ]
        monitor_port = free_port() if monitor else None
        config = home / "nats.conf"
        config.write_text(
            f"server_name: {node_name}\n"
            f"listen: {host}:{port}\n"
            + (f"http: {host}:{monitor_port}\n" if monitor_port else "")
            + f"jetstream {{ store_dir: {json.dumps(str(home / 'js'))} }}\n"
            f"cluster {{\n  name: {name}\n  listen: {host}:{route_port}\n"
            f"  no_advertise: {json.dumps(not advertise)}\n"
            f"  routes: {json.dumps(routes)}\n}}\n" + authorization
        )
        server = start_managed_server(
            f"nats://{host}:{port}",
            [*(place.prefix if place else []), binary, "-c", str(config)],
            home / "nats.log",
            # the client port; JetStream answers only once the nodes have elected a meta
            # leader, which needs the others: checked for all at once below
            ready=lambda url: port_open(*_address(url)),
            timeout=timeout,
        )
        cluster.nodes.append(Node(node_name, port, server, host, place, monitor_port))
    cluster.wait_for_jetstream(timeout)


def _wait_until_each_says_ready(cluster: NatsCluster, timeout: float) -> None:
    """Return once each node's own log says it listens on all its ports (JetStream answered on
    those ports, so these nodes are the cluster); :class:`LocalServerError` naming the node's
    log when one has ended (a port of it taken meanwhile, whose new owner may have answered for
    it) or has not said so within ``timeout``."""
    deadline = time.monotonic() + timeout
    for node in cluster.nodes:
        assert node.server.process is not None and node.server.log_file is not None
        while _READY not in _read(node.server.log_file) or node.server.process.poll() is not None:
            if node.server.process.poll() is not None or time.monotonic() >= deadline:
                raise LocalServerError(
                    f"nats cluster: {node.name} did not start; see {node.server.log_file}"
                )
            time.sleep(0.05)


def _read(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    return host, int(port)
