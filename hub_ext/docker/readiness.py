"""Whether a starting server answers yet: the Docker backend's wait until ready
(:func:`wait_until_ready`), which checks the port with a cheap TCP connect
(:func:`port_open`) and asks HTTP only once the port is open.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import select
import socket
import time

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

__all__ = ["ServerExited", "port_open", "wait_until_ready"]


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


class ServerExited(Exception):
    """The server's process ended while the hub waited for it; ``status`` is what its poll
    said."""

    def __init__(self, status):
        super().__init__(f"exited ({status})")
        self.status = status


async def wait_until_ready(
    ip: str,
    port: int,
    url: str,
    timeout: float,
    interval: float,
    exited,
    exit_check_interval: float = 0.5,
) -> bool:
    """Wait until the server answers HTTP at ``url`` at all, for at most ``timeout``
    seconds; False when it has not answered by then (JupyterHub's own wait,
    ``Spawner.http_timeout``, then decides).

    First the port, with a TCP connect every ``interval`` seconds: while nothing listens the
    kernel refuses at once, so the checks can be frequent without taking CPU from the
    starting server.  Once the port takes connections (Jupyter Server binds it at the first
    turn of its event loop, ``ServerApp.init_httpserver``), one HTTP request; a failed one
    (reset, time-out) goes back to the port checks.  So the server is found up within about
    ``interval`` of binding, and JupyterHub's own first check (``Server.wait_up``) then
    succeeds at once.

    ``exited`` (async, no arguments; the spawner's ``poll``) is asked every
    ``exit_check_interval`` seconds; :class:`ServerExited` is raised when it says the
    server ended.
    """
    client = AsyncHTTPClient()
    deadline = time.monotonic() + timeout
    next_exit_check = time.monotonic() + exit_check_interval
    while time.monotonic() < deadline:
        if await port_open(ip, port):
            try:
                await client.fetch(
                    url, request_timeout=2, follow_redirects=False, raise_error=False
                )
                return True
            except (ConnectionError, OSError, HTTPClientError):
                pass
        if time.monotonic() >= next_exit_check:
            next_exit_check = time.monotonic() + exit_check_interval
            status = await exited()
            if status is not None:
                raise ServerExited(status)
        await asyncio.sleep(interval)
    return False
