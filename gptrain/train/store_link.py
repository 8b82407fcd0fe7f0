"""Whether the job's store server (rank 0's process) has closed this process's connection, asked
without a store call.

A store call on a connection whose server is gone makes c10d log a warning carrying the C++ stack
of its exception (`TCPStore.cpp:125] recvValue failed ... frame #0 ... frame #19`, 16 lines) before
it raises, and torch offers no scoped way to quiet that log: only TORCH_CPP_LOG_LEVEL, for the whole
process and read at its start. So the watchdog looks first: it finds the store client's socket once
(the descriptor of this process connected to the store's host and port), keeps a duplicate, and
peeks at it without blocking. A server that ended closed it (end of file or reset); a live one sends
nothing unasked. No packet is sent and the store's server sees nothing. Under a process-wide
socket.setdefaulttimeout() nothing is looked for: a socket object made of the duplicate would set
O_NONBLOCK on the file description it shares with c10d's socket.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from typing import Any

MAPPED_IPV4 = "::ffff:"


def store_address(store: Any) -> tuple[str, int] | None:
    """The host and port of the TCPStore under `store`'s prefixes; None for another kind of store."""
    while hasattr(store, "underlying_store"):  # a PrefixStore (the default group's is two deep)
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    return (host, port) if isinstance(host, str) and isinstance(port, int) and host and port else None


class StoreLink:
    """A duplicate of the store client's socket (None where it cannot be found: then nothing is known
    and the store is called as before). `close` gives it back, so the connection ends with c10d's."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self.sock = sock

    @classmethod
    def find(cls, store: Any) -> StoreLink:
        address = store_address(store)
        if address is None or not os.path.isdir("/proc/self/fd"):
            return cls()
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(*address, type=socket.SOCK_STREAM)}
        except OSError:
            return cls()
        for name in os.listdir("/proc/self/fd"):
            if (sock := connected_to(int(name), addresses, address[1])) is not None:
                return cls(sock)
        return cls()

    def closed(self, wait_s: float = 0.0) -> bool:
        """Whether the server has closed the connection (waiting up to `wait_s` for it to)."""
        if self.sock is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            select.select([self.sock], [], [], wait_s)
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False  # nothing to read: open
        except OSError:
            return True  # reset

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def connected_to(fd: int, addresses: set[str], port: int) -> socket.socket | None:
    """A duplicate of descriptor `fd` when it is a TCP socket connected to one of `addresses` at `port`.
    None under a default timeout: Python makes a socket it wraps non-blocking then, and the duplicate
    shares its file description (its O_NONBLOCK) with `fd`'s owner."""
    if socket.getdefaulttimeout() is not None:
        return None
    try:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
            return None
        duplicate = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=duplicate)
    except OSError:  # a socket Python cannot wrap (netlink, ...)
        os.close(duplicate)
        return None
    try:
        peer = sock.getpeername()
    except OSError:
        peer = None
    hosts = {address.removeprefix(MAPPED_IPV4) for address in addresses}
    if (
        sock.type == socket.SOCK_STREAM
        and isinstance(peer, tuple)
        and peer[1] == port
        and peer[0].removeprefix(MAPPED_IPV4) in hosts
    ):
        return sock
    sock.close()
    return None
