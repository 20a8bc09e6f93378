"""Where a job's HTTP steps (HTTP_WEBHOOK, SLACK_NOTIFY) may go.

A job is data an operator registers, and its URLs may come from device data, so the orchestrator
treats every call it makes for a job as untrusted egress:

* https only; plain http only to a host on the allow-list;
* the address actually connected to must be a public one: loopback, link-local (the cloud
  metadata endpoints 169.254.169.254 and fd00:ec2::254 among them), private, shared, reserved and
  multicast ranges are refused unless the host or the address is on the allow-list
  (``AEGIS_JOB_EGRESS_ALLOW``: host names and networks, comma separated). The check runs on the
  resolved addresses inside the connection (:class:`GuardedResolver`), so a name that resolves to
  a private address, or changes its answer between a check and the connect, is refused too;
* no redirects (a 3xx answer is an error naming where it pointed);
* only the methods a webhook uses;
* at most ``max_response_bytes`` of an answer are read.

Refusals raise :class:`EgressRefused` with the reason, which the step's log shows.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

EGRESS_ALLOW_VAR = "AEGIS_JOB_EGRESS_ALLOW"
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressRefused(OSError):
    """A call the egress policy does not allow (an OSError, so aiohttp passes it through its
    connector as the cause of the connection error)."""


def _public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class EgressPolicy:
    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    max_response_bytes: int = 64 * 1024

    @classmethod
    def parse(cls, allow: Iterable[str], *, max_response_bytes: int = 64 * 1024) -> EgressPolicy:
        """``allow``: host names (``hooks.internal``) and addresses or networks (``10.0.0.0/8``,
        ``127.0.0.1``). Anything else is a configuration error."""
        hosts: set[str] = set()
        networks: list[Network] = []
        for raw in allow:
            entry = raw.strip().lower()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            if not _HOST_NAME.fullmatch(entry):
                raise ValueError(f"egress allow-list entry {raw!r} is not a host name or network")
            hosts.add(entry)
        return cls(frozenset(hosts), tuple(networks), max_response_bytes)

    def _listed(self, host: str, address: Address | None = None) -> bool:
        if host.lower().rstrip(".") in self.hosts:
            return True
        return address is not None and any(address in net for net in self.networks)

    def check_address(self, host: str, address: str) -> None:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if _public(ip) or self._listed(host, ip):
            return
        raise EgressRefused(
            f"{host} resolves to {ip}, a non-public address (loopback, link-local or metadata, "
            "private, reserved): not allowed for job steps unless listed in AEGIS_JOB_EGRESS_ALLOW"
        )

    def check_request(self, url: str, method: str) -> URL:
        """The URL to call, or :class:`EgressRefused` for a scheme, method or literal address the
        policy refuses (names are checked when they resolve)."""
        method = method.upper()
        if method not in METHODS:
            raise EgressRefused(f"method {method!r} is not allowed ({', '.join(sorted(METHODS))})")
        try:
            parsed = URL(url)
        except ValueError as err:
            raise EgressRefused(f"url {url!r:.80} does not parse: {err}") from None
        host = parsed.host
        if not host or parsed.scheme not in ("http", "https"):
            raise EgressRefused(f"url {str(parsed.with_query(None))!r:.80} is not http(s)")
        if parsed.scheme == "http" and not self._listed(host, _literal(host)):
            raise EgressRefused(
                f"http://{host} is plain http: job steps call https, or http only to a host "
                "listed in AEGIS_JOB_EGRESS_ALLOW"
            )
        if _literal(host) is not None:
            self.check_address(host, host)
        return parsed


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, keeping only the addresses ``policy`` allows for the host."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.inner = inner or aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        allowed, refusal = [], None
        for result in found:
            try:
                self.policy.check_address(host, result["host"])
            except EgressRefused as err:
                refusal = err
            else:
                allowed.append(result)
        if not allowed:
            raise refusal or EgressRefused(f"{host} resolves to no address")
        return allowed

    async def close(self) -> None:
        await self.inner.close()


def guarded_session(policy: EgressPolicy) -> aiohttp.ClientSession:
    """A client session whose connections go only where ``policy`` allows (no proxies from the
    environment, no cookies kept between jobs)."""
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(policy))
    return aiohttp.ClientSession(
        connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
    )
