"""A private network of hosts in network namespaces, for tests of partitions and half-open
connections: packets dropped on a link, with no FIN or RST, as a failed switch or a cable
pulled between two machines drops them.

:func:`open_network` makes a hub namespace with a bridge and, per :meth:`Network.host`, a
namespace joined to that bridge by a veth pair, with an address of a private /24 chosen so that
it overlaps no route of this machine; :meth:`Network.join` gives this process's namespace an
address on it too. :meth:`Network.cut` drops every packet leaving either end of a host's link
(a ``blackhole`` queueing discipline: the sender's kernel thinks it sent them, so nothing
answers and nothing closes), :meth:`Network.heal` lets them through again. Every name has a
random suffix, so runs side by side never meet; :meth:`Network.close` ends what still runs in
the namespaces and deletes them, which deletes their links. Needs root and iproute2's ``ip``
and ``tc``; :func:`unavailable` says why a test cannot have this here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

__all__ = ["Host", "Network", "NetworkError", "open_network", "unavailable"]

_SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"
# the private /24s a network may take: 10.200.0.0/24 to 10.254.255.0/24
_FIRST_OCTET, _SECOND_OCTETS = 10, range(200, 255)


class NetworkError(RuntimeError):
    """An ``ip`` or ``tc`` command failed (its message names the command and what it said)."""


def _binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=_SBIN_PATH)


_TC = _binary("tc") or "tc"


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [_binary(argv[0]) or argv[0], *argv[1:]]
    done = subprocess.run(  # noqa: S603 (fixed argv, no shell)
        argv, capture_output=True, text=True, timeout=30, check=False
    )
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Host:
    """One machine of the network: its namespace, its address, and its link to the bridge
    (``link`` inside the namespace, ``port`` its other end, on the hub's bridge)."""

    name: str
    namespace: str
    address: str
    link: str
    port: str

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return [_binary("ip") or "ip", "netns", "exec", self.namespace]


@dataclass
class Network:
    suffix: str
    subnet: ipaddress.IPv4Network
    hub: str
    hosts: dict[str, Host] = field(default_factory=dict)
    # this namespace's end of its link to the hub, once joined
    joined: str | None = None
    _namespaces: list[str] = field(default_factory=list)
    _cut: set[str] = field(default_factory=set)

    def _address(self, index: int) -> str:
        return str(self.subnet.network_address + index)

    def host(self, name: str) -> Host:
        """A new host ``name`` (letters and digits): a namespace of its own with loopback up
        and the network's next address."""
        index = 10 + len(self.hosts)
        namespace = f"aegis-{self.suffix}-{name}"
        host = Host(
            name=name,
            namespace=namespace,
            address=self._address(index),
            link=f"ae{self.suffix}h{index}",
            port=f"ae{self.suffix}b{index}",
        )
        _run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)
        self.hosts[name] = host
        _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        self._wire(host.link, namespace, host.port)
        _run(["ip", "-n", namespace, "addr", "add", f"{host.address}/24", "dev", host.link])
        _run(["ip", "-n", namespace, "link", "set", host.link, "up"])
        return host

    def join(self) -> str:
        """Give this process's own namespace the network's first address (and so a route to
        every host); returns that address."""
        if self.joined is None:
            link, port = f"ae{self.suffix}r", f"ae{self.suffix}p"
            _run(["ip", "link", "add", link, "type", "veth", "peer", "name", port])
            self.joined = link
            _run(["ip", "link", "set", port, "netns", self.hub])
            self._attach(port)
            _run(["ip", "addr", "add", f"{self._address(1)}/24", "dev", link])
            _run(["ip", "link", "set", link, "up"])
        return self._address(1)

    def _wire(self, link: str, namespace: str, port: str) -> None:
        veth = ["type", "veth", "peer", "name", port, "netns", self.hub]
        _run(["ip", "link", "add", link, "netns", namespace, *veth])
        self._attach(port)

    def _attach(self, port: str) -> None:
        _run(["ip", "-n", self.hub, "link", "set", port, "master", "br0"])
        _run(["ip", "-n", self.hub, "link", "set", port, "up"])

    def cut(self, host: Host) -> None:
        """Drop every packet to and from ``host`` (both ends of its link), silently: no FIN,
        no RST, no ICMP; its link stays up, so its own kernel notices nothing either."""
        self._cut.add(host.name)
        for namespace, device in ((host.namespace, host.link), (self.hub, host.port)):
            qdisc = ["qdisc", "replace", "dev", device, "root", "blackhole"]
            _run(["ip", "netns", "exec", namespace, _TC, *qdisc])

    def heal(self, host: Host) -> None:
        """Let ``host``'s packets through again."""
        for namespace, device in ((host.namespace, host.link), (self.hub, host.port)):
            qdisc = ["qdisc", "del", "dev", device, "root"]
            _run(["ip", "netns", "exec", namespace, _TC, *qdisc])
        self._cut.discard(host.name)

    def run(self, host: Host, argv: Sequence[str], timeout: float = 10.0) -> str:
        """Run ``argv`` on ``host``; its standard output (a failure raises NetworkError)."""
        done = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            [*host.prefix, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise NetworkError(f"{argv[0]} on {host.name} failed: {done.stderr.strip()}")
        return done.stdout

    def close(self) -> None:
        """End every process still running in the namespaces, then delete them (and with them
        every link, this namespace's end included)."""
        for namespace in reversed(self._namespaces):
            pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run(["ip", "netns", "del", namespace], check=False)
        self._namespaces.clear()
        if self.joined is not None:
            # the veth pair goes with its end in the hub; wait for it, then make sure
            deadline = time.monotonic() + 5
            while _run(["ip", "link", "show", self.joined], check=False).returncode == 0:
                if time.monotonic() > deadline:
                    _run(["ip", "link", "del", self.joined], check=False)
                    break
                time.sleep(0.05)
            self.joined = None


def _taken() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has a route or an address in."""
    found = []
    for argv in (["ip", "-4", "-o", "route", "show", "table", "all"], ["ip", "-4", "-o", "addr"]):
        for line in _run(argv).stdout.splitlines():
            for word in line.split():
                with contextlib.suppress(ValueError):
                    if "/" in word or word[:1].isdigit():
                        found.append(ipaddress.IPv4Network(word, strict=False))
    return found


def _free_subnet() -> ipaddress.IPv4Network:
    taken = _taken()
    for _ in range(200):
        second = _SECOND_OCTETS[secrets.randbelow(len(_SECOND_OCTETS))]
        subnet = ipaddress.IPv4Network(f"{_FIRST_OCTET}.{second}.{secrets.randbelow(256)}.0/24")
        if not any(subnet.overlaps(other) for other in taken if other.prefixlen > 0):
            return subnet
    raise NetworkError("no free private /24 in 10.200.0.0 to 10.254.255.0")


@contextlib.contextmanager
def open_network() -> Iterator[Network]:
    """A network of its own (a hub namespace with its bridge); deleted with everything on it
    when the block ends, however it ends."""
    suffix = secrets.token_hex(3)
    network = Network(suffix=suffix, subnet=_free_subnet(), hub=f"aegis-{suffix}-hub")
    try:
        _run(["ip", "netns", "add", network.hub])
        network._namespaces.append(network.hub)
        _run(["ip", "-n", network.hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", network.hub, "link", "set", "br0", "up"])
        yield network
    finally:
        network.close()


def unavailable() -> str | None:
    """Why this machine cannot run a :class:`Network` (not root, no ``ip`` or ``tc``, no
    network namespaces, veth pairs or blackhole qdisc), or None when it can: a network with one
    host and a cut link is made and deleted to find out."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [name for name in ("ip", "tc") if _binary(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (iproute2)"
    try:
        with open_network() as network:
            network.cut(network.host("p"))
    except (NetworkError, OSError, subprocess.TimeoutExpired) as err:
        return f"network namespaces are not usable here: {err}"
    return None
