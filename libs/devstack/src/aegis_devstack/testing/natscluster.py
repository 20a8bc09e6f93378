"""A JetStream cluster of local nats-servers for tests of replicated streams: each node with its
own client port, route port and store, natsauth's identities on every node (as a deployment's
cluster has them), and nodes that can be killed like a crash and brought back with their store.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aegis_cli.natsauth import ADMIN, server_authorization
from aegis_devstack.localservers import (
    NATS_SERVER,
    LocalServerError,
    ManagedServer,
    free_port,
    jetstream_account_info,
    port_open,
    start_managed_server,
)
from aegis_runtime.settings import AegisSettings

__all__ = ["NatsCluster", "Node", "nats_server_binary", "start_cluster"]


def nats_server_binary() -> str | None:
    """The machine's nats-server, or None when it is not installed."""
    found = shutil.which("nats-server")
    if found is None and Path(NATS_SERVER).exists():
        found = NATS_SERVER
    return found


@dataclass
class Node:
    """One server of the cluster; ``name`` is its JetStream server name (what stream info calls
    the leader and the replicas)."""

    name: str
    port: int
    server: ManagedServer

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


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
                    jetstream_account_info(f"nats://{ADMIN}:{secret}@127.0.0.1:{node.port}", 1.0)
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
) -> NatsCluster:
    """``size`` nats-servers on free ports of 127.0.0.1, routed to each other, JetStream in
    ``folder/<node>``, and the authorization block of ``passwords`` (``admin`` and identities of
    :mod:`aegis_cli.natsauth`). Returns once JetStream answers on every node.

    Like the NATS Helm chart the AWS overlay deploys, the nodes do not tell clients about each
    other (``no_advertise``) unless ``advertise``: clients then know only the URLs they were
    given."""
    binary = nats_server_binary()
    if binary is None:
        raise LocalServerError("nats-server is not installed")
    # bcrypt is slow on purpose: one block for every node
    authorization = server_authorization(passwords)
    ports = [(free_port(), free_port()) for _ in range(size)]
    cluster = NatsCluster(nodes=[], passwords=dict(passwords))
    try:
        for index, (port, route_port) in enumerate(ports, 1):
            node_name = f"n{index}"
            home = folder / node_name
            home.mkdir(parents=True, exist_ok=True)
            routes = [f"nats-route://127.0.0.1:{r}" for _, r in ports if r != route_port]
            config = home / "nats.conf"
            config.write_text(
                f"server_name: {node_name}\n"
                f"listen: 127.0.0.1:{port}\n"
                f"jetstream {{ store_dir: {json.dumps(str(home / 'js'))} }}\n"
                f"cluster {{\n  name: {name}\n  listen: 127.0.0.1:{route_port}\n"
                f"  no_advertise: {json.dumps(not advertise)}\n"
                f"  routes: {json.dumps(routes)}\n}}\n" + authorization
            )
            server = start_managed_server(
                f"nats://127.0.0.1:{port}",
                [binary, "-c", str(config)],
                home / "nats.log",
                # the client port; JetStream answers only once the nodes have elected a meta
                # leader, which needs the others: checked for all at once below
                ready=lambda url: port_open("127.0.0.1", int(url.rsplit(":", 1)[1])),
                timeout=timeout,
            )
            cluster.nodes.append(Node(node_name, port, server))
        cluster.wait_for_jetstream(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
