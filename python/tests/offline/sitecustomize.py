"""No network beyond loopback, for the Python tests: an audit hook in every Python process that
has this directory on `PYTHONPATH` and `NO_NETWORK_LOG` set (`just test-meltano` and `just
test-wheel` set both for pytest, and pytest's children inherit them).

The hook refuses name lookups (`socket.getaddrinfo`, `gethostbyname`, ...) and connections
(`socket.connect`, `sendto`, `sendmsg`) to anything but loopback, Unix sockets and the host of
`$CLICKHOUSE_URL` (the ClickHouse under test may be elsewhere), plus the hosts named in
`NO_NETWORK_ALLOW` (comma-separated). Each refusal raises `PermissionError` in the caller and is
appended to the file `$NO_NETWORK_LOG`, so that one swallowed by the caller (as Meltano swallows
a failed version check) still fails the recipe, which checks the file is empty.

It covers the test process and the Python processes it starts with its environment: Meltano,
the lock workers, the tests' own ClickHouse server. Not the plugins (Meltano drops `PYTHONPATH`
from a plugin's environment; the repository's tap and target use no sockets) nor the Rust host,
which has a tripwire of its own (`STATE_BACKEND_TRIPWIRE`, set by `conftest.py`).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from urllib.parse import urlsplit

LOG = os.environ.get("NO_NETWORK_LOG")


def _allowed_names() -> set[str]:
    names = {"localhost"}
    url = os.environ.get("CLICKHOUSE_URL")
    if url and urlsplit(url).hostname:
        names.add(urlsplit(url).hostname.lower())
    names.update(
        name.strip().lower()
        for name in os.environ.get("NO_NETWORK_ALLOW", "").split(",")
        if name.strip()
    )
    return names


def _host(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        value = value.decode(errors="replace")
    return str(value).strip("[]").split("%")[0].lower()


def _ip(host: str):
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class _Guard:
    def __init__(self, log: str):
        self.log = log
        self.names = _allowed_names()
        self.addresses: set[str] | None = None  # of the allowed names, resolved when needed

    def local(self, host: str | None) -> bool:
        if not host:  # getaddrinfo(None, ...): the local or wildcard address
            return True
        if host in self.names or host.endswith(".localhost"):
            return True
        ip = _ip(host)
        if ip is None:
            return False
        if ip.is_loopback or ip.is_unspecified:
            return True
        return host in self.resolved()

    def resolved(self) -> set[str]:
        if self.addresses is None:
            # (these lookups pass the hook: the names are allowed)
            addresses = set()
            for name in self.names:
                if _ip(name) is None and name != "localhost":
                    try:
                        infos = socket.getaddrinfo(name, None)
                    except OSError:
                        continue
                    addresses.update(_host(info[4][0]) for info in infos)
            self.addresses = addresses
        return self.addresses

    def refuse(self, event: str, target) -> None:
        argv = " ".join(getattr(sys, "argv", []))[:200]
        line = f"{event} {target!r} (pid {os.getpid()}: {argv})"
        try:
            with open(self.log, "a") as log:
                log.write(line + "\n")
        except OSError:
            pass
        raise PermissionError(f"no network beyond loopback in the tests: {line}")

    def __call__(self, event: str, args: tuple) -> None:
        if not event.startswith("socket."):
            return
        if event == "socket.getaddrinfo":
            if not self.local(_host(args[0])):
                self.refuse(event, args[0])
        elif event in ("socket.gethostbyname", "socket.gethostbyaddr"):
            if not self.local(_host(args[0])):
                self.refuse(event, args[0])
        elif event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
            sock, address = args[0], args[1]
            if address is None or getattr(sock, "family", None) not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                return
            if not self.local(_host(address[0])):
                self.refuse(event, address)


if LOG:
    sys.addaudithook(_Guard(LOG))
