"""The address rule for every outgoing URL a target is given (a SemIf adapter, a /v1/systemone
server, a chat server): checked when the target is saved and again before each request.

- http or https only; no user:password@ in the URL, no `?query` and no `#fragment` in a base URL (the
  workbench appends /invocations, /info, /v1/models: `http://host/admin?x=` would have made the
  connection test request /admin, with the key attached);
- the host is resolved and *every* address it resolves to is checked: link-local addresses
  (169.254.0.0/16, fe80::/10) and the cloud metadata services (169.254.169.254, fd00:ec2::254 on AWS,
  100.100.100.200 on Alibaba, 192.0.0.192 on Oracle; IPv4-mapped forms too) are refused - a target there
  could read this machine's cloud credentials - unless the operator sets SEMIF_ALLOW_LINK_LOCAL_TARGETS=1;
- private ranges (10/8, 172.16/12, 192.168/16, fc00::/7) and loopback stay allowed: self-hosted
  adapters live there, and the Targets form says so;
- redirects are never followed (app/targets/base.http_json): a 3xx is an error, so a key is only ever
  sent to the URL the analyst entered.

A name that resolves differently between the check and the connection (DNS rebinding) is checked
again before each request, not pinned: the residual window is one resolution.
"""
from __future__ import annotations

import ipaddress
import socket
from typing import Callable
from urllib.parse import urlsplit

ALLOW_SETTING = "SEMIF_ALLOW_LINK_LOCAL_TARGETS"
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "169.254.169.123", "fd00:ec2::254", "fd00:ec2::23", "100.100.100.200",
    "192.0.0.192"))
PRIVATE_NOTE = ("private addresses (10.x, 172.16-31.x, 192.168.x, 127.0.0.1) are allowed for self-hosted adapters; "
                f"link-local and cloud metadata addresses (169.254.0.0/16, fd00:ec2::254) are refused unless "
                f"{ALLOW_SETTING}=1")

Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo: IPv4 and IPv6)."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


def refused_address(address: str) -> str | None:
    """Why a target may not be reached at this IP address, or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id (fe80::1%eth0) is no part of the address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA:
        return f"{ip} is a cloud metadata service (it hands out this machine's credentials)"
    if ip.is_link_local:
        return f"{ip} is a link-local address (169.254.0.0/16, fe80::/10: cloud metadata lives there)"
    if ip.is_multicast or (ip.is_reserved and not ip.is_private):
        return f"{ip} is a multicast or reserved address"
    return None


def url_problem(url: str, *, allow_link_local: bool = False, resolver: Resolver = resolve) -> str | None:
    """Why a target may not be given this base URL, or None (the rules in this module's docstring)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL ({exc}): give e.g. http://127.0.0.1:8080"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "give a full http(s):// URL, e.g. http://127.0.0.1:8080"
    if parts.username is not None or parts.password is not None:
        return "no user:password@ in the URL: give a key as the API key setting (a SEMIF_KEY_* variable)"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "no '?' or '#' in a base URL: the workbench appends the route (/invocations, /info) to it"
    if any(ch.isspace() for ch in url):
        return "no spaces in a URL"
    if allow_link_local:
        return None
    try:
        addresses = resolver(parts.hostname, port or (443 if parts.scheme == "https" else 80))
    except (OSError, UnicodeError) as exc:
        return f"{parts.hostname} does not resolve ({exc}): check the host name"
    for address in addresses:
        why = refused_address(address)
        if why:
            return (f"{parts.hostname} resolves to {why}: not allowed as a target ({PRIVATE_NOTE})")
    return None
