"""Listening addresses: why one cannot be used, in one line that names its setting.

The services (and the web demo) check their address before they start anything (a
database, a profile's resources), and the console binds it first thing, so a port
already in use costs a second, not a traceback: `cannot listen on 127.0.0.1:8080: the
address is already in use; set CONSOLE_LISTEN_ADDRESS to another address (port 0 picks
a free one)`, exit status 2.
"""

from __future__ import annotations

import errno
import socket

from agentstate.common.config import ConfigError


def reason_of(exc: OSError) -> str:
    """Why a bind failed, in words an operator acts on."""
    if exc.errno == errno.EADDRINUSE:
        return "the address is already in use"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no network interface of this machine has that address"
    return exc.strerror or str(exc)


def cannot_listen(address: str, setting: str, reason: str) -> ConfigError:
    """`setting`: the variable (or, starting with --, the flag) that holds the address."""
    fix = ""
    if setting:
        change = f"give {setting}" if setting.startswith("--") else f"set {setting} to"
        fix = f"; {change} another address (port 0 picks a free one)"
    return ConfigError(f"cannot listen on {address}: {reason}{fix}")


def check_listen_address(address: str, setting: str) -> None:
    """ConfigError (cannot_listen) when host:port cannot be bound now. A unix: path, port
    0, and an address that is not host:port are left to the server, which reports them."""
    if address.startswith("unix:"):
        return
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) == 0:
        return
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(
            host or None, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        reason = f"{host!r} does not resolve ({exc.strerror})"
        raise cannot_listen(address, setting, reason) from None
    failure: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            # As the servers bind: a port left in TIME_WAIT by an earlier run is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                failure = failure or exc
            else:
                return  # one resolved address is enough, as it is for gRPC
    if failure is not None:
        raise cannot_listen(address, setting, reason_of(failure))
