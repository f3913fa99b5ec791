"""The readiness wait's port check (hub_ext.docker.readiness.port_open) against real sockets
on the loopback: a listener, a closed port, a listener whose backlog is full (the connect
stays under way, so the wait on the event loop is what answers), IPv6 and a host name."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest

from hub_ext.docker.readiness import port_open


@contextlib.contextmanager
def listener(host: str = "127.0.0.1", backlog: int = 8):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        sock.listen(backlog)
        yield sock, sock.getsockname()[1]


def closed_port() -> int:
    with listener() as (_, port):
        return port  # nothing listens there once the block has closed it


async def test_a_listening_port_is_open_and_the_check_connects_once():
    with listener() as (sock, port):
        assert await port_open("127.0.0.1", port)
        conn, _ = sock.accept()  # the check's connection reached the listener
        assert conn.recv(1) == b""  # and was closed again at once
        conn.close()


async def test_a_port_nobody_listens_on_is_closed_at_once():
    port = closed_port()
    tic = time.monotonic()
    assert not await port_open("127.0.0.1", port)
    assert not await port_open("127.0.0.1", port, timeout=5)
    assert time.monotonic() - tic < 1  # refused by the kernel, not timed out


async def test_a_port_no_socket_can_connect_to_is_not_open_and_nothing_raises():
    assert not await port_open("127.0.0.1", 70000)
    assert not await port_open("127.0.0.1", -1)


@contextlib.asynccontextmanager
async def full_backlog():
    """A listener that takes no connection, its backlog full: Linux drops the next SYN (and
    retries it after 1 s), so a connect to it stays under way.  Yields ``(sock, port)``."""
    with listener(backlog=0) as (sock, port):
        fillers = []
        try:
            for _ in range(4):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)
            await asyncio.sleep(0.1)
            yield sock, port
        finally:
            for filler in fillers:
                filler.close()


async def test_a_connect_left_under_way_is_waited_for_until_the_timeout():
    # only the wait on the event loop can answer it
    async with full_backlog() as (_, port):
        tic = time.monotonic()
        assert not await port_open("127.0.0.1", port, timeout=0.3)
        assert 0.25 < time.monotonic() - tic < 2


async def test_a_connect_left_under_way_that_is_then_taken_is_open():
    # the listener starts taking connections: the kernel's SYN retry gets the check's
    # connection in, and the wait on the event loop sees it taken
    async with full_backlog() as (sock, port):
        done = threading.Event()
        taken = []

        def take():  # the listener takes what comes until the check is over
            sock.settimeout(0.1)
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    taken.append(sock.accept()[0])

        taking = asyncio.get_running_loop().run_in_executor(None, take)
        try:
            assert await port_open("127.0.0.1", port, timeout=5)
        finally:
            done.set()
            await taking
            for conn in taken:
                conn.close()


def _has_ipv6_loopback() -> bool:
    try:
        with listener("::1"):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
async def test_an_ipv6_loopback_port_is_open_while_listened_on_then_closed():
    with listener("::1") as (_, port):
        assert await port_open("::1", port)
    assert not await port_open("::1", port)


async def test_a_host_name_is_resolved_and_connected():
    with listener() as (_, port):
        assert await port_open("localhost", port)
    assert not await port_open("localhost", closed_port())
