"""Refuses connections to other hosts and logs them to NO_NETWORK_LOG."""

import os
import socket

_LOCAL = {"127.0.0.1", "localhost", "::1", "0.0.0.0", socket.gethostname()}
_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def _refuse(host) -> None:
    with open(os.environ["NO_NETWORK_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{os.getpid()} {host}\n")
    raise OSError(f"network access to {host} refused by the test")


def _host(address):
    return address[0] if isinstance(address, tuple) else None


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and _host(address) not in _LOCAL:
        _refuse(_host(address))
    return _connect(self, address)


def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and _host(address) not in _LOCAL:
        _refuse(_host(address))
    return _connect_ex(self, address)


def getaddrinfo(host, *args, **kwargs):
    if host not in _LOCAL and host is not None:
        _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)


if os.environ.get("NO_NETWORK_LOG"):
    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
