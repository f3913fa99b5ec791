"""Whether a starting server's port takes connections yet: the cheap first half of the
Docker spawner's readiness wait (:meth:`hub_ext.docker.spawner.GPUDockerSpawner.
_wait_until_ready`), which asks HTTP only once the port is open.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import select
import socket

__all__ = ["port_open"]


async def port_open(ip: str, port: int, timeout: float = 0.5) -> bool:
    """Whether ``ip:port`` takes a TCP connection now (closed again at once).  False when
    refused, unreachable, or not answered in ``timeout`` seconds; never raises.

    A non-blocking ``connect(2)``: to a loopback address (host networking) the kernel
    answers at once, refused or taken (read with a poll of no wait and ``SO_ERROR``), so
    the check makes none of asyncio's coroutines, transports or exceptions.  A connect
    still under way (a bridge network's container address, a full listen backlog) is
    waited for on the event loop (``loop.sock_connect``); a host name goes through
    ``asyncio.open_connection``.  The spawner checks each starting server every
    ``ready_poll_interval`` seconds: under a rush of 8 starts, asyncio's refused
    connections took about a quarter of the hub's event loop (py-spy;
    docs/benchmarks.md).
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    except ValueError:  # a host name: resolved and connected by asyncio
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # out of file descriptors, no IPv6 in this kernel
        return False
    with sock:
        sock.setblocking(False)
        try:
            error = sock.connect_ex((ip, port))
        except (OSError, OverflowError):
            return False
        if error == errno.EINPROGRESS:
            # Linux answers EINPROGRESS even on the loopback, where the handshake (or the
            # refusal) has already happened: then the socket is writable now, and SO_ERROR
            # tells which (connect(2), "EINPROGRESS")
            ready = select.poll()
            ready.register(sock, select.POLLOUT)
            if ready.poll(0):
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error == 0:
            return True
        if error != errno.EINPROGRESS:
            return False  # refused, unreachable
        try:
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_connect(sock, (ip, port)), timeout
            )
        except (OSError, TimeoutError):
            return False
        return True
