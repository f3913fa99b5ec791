"""What a job request may cost the hub: one at a time per member, the notebook read and
parsed away from the hub's event loop.

JupyterHub serves every request from one event loop: a request that computes holds up all
the others, the hub API's and the pages' alike.  A job request is the one request of a
member that reads a file of up to ``GPUHUB_JOB_NOTEBOOK_MAX_MIB`` and parses it, so:

- :class:`MemberTurns`: a member's job requests are taken one at a time, in the order they
  came (the per-member limit and the idempotency token are then counted with nothing in
  between), at most one each ``c.Jobs.request_interval`` seconds, and at most
  :attr:`MemberTurns.waiting` more wait their turn; past that the request is refused at
  once (429);
- :func:`load_notebook`: the notebook is opened in a thread, read and parsed in a child
  process (:mod:`hub_ext.jobs.notebook_check`: a parse holds Python's GIL, so a thread
  would stall the loop as much), at most :data:`CHECKS_AT_ONCE` at a time for the whole
  hub, each bounded in memory and CPU time and at the lowest CPU priority; only a
  notebook is then read by the hub (in a thread, ``os.pread`` and SHA-256 let go of the
  GIL), to be copied.

A request refused for what it says (its body, its size, the limit, the profile) is refused
before the notebook is opened (:func:`hub_ext.jobs.lifecycle.create`); the order is told in
docs/reference/jobs-api ("How a job request is taken"), the figures in docs/benchmarks
("Job requests": the hub API while a member floods refused job requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import sys
import weakref

from ..spawn.profiles import quote
from . import notebook_check
from .checks import JobRefused, notebook_refusal, open_notebook, read_open

__all__ = ["CHECKS_AT_ONCE", "WAITING", "MemberTurns", "load_notebook"]

#: notebooks checked at once in child processes, for the whole hub
CHECKS_AT_ONCE = 2
#: a member's job requests that may wait for her turn (past it: 429)
WAITING = 16
#: the CPU priority of a check (``nice``): the lowest, the hub's event loop goes first
NICENESS = 19
#: the event loop -> its semaphore of :data:`CHECKS_AT_ONCE`
_checks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class MemberTurns:
    """One job request of a member at a time (:meth:`turn`), in the order they came, each
    at least ``interval`` seconds after her one before, with at most ``waiting`` more of
    hers waiting (one hub process; asyncio's ``Lock`` is first come, first served).

    The interval is what bounds a flood: a client waits for each answer before it sends
    again, so a member's requests reach the hub no faster than the hub takes them, and
    those waiting their turn cost the event loop nothing."""

    def __init__(self, waiting: int = WAITING, interval: float = 0.0):
        self.waiting, self.interval = waiting, interval
        self._locks: dict[str, asyncio.Lock] = {}
        self._queued: dict[str, int] = {}
        #: member -> when (the event loop's clock) her last turn began
        self._last: dict[str, float] = {}

    def queued(self, name: str) -> int:
        """``name``'s requests taken or waiting now."""
        return self._queued.get(name, 0)

    @contextlib.asynccontextmanager
    async def turn(self, name: str):
        """Wait for ``name``'s turn.  Raises :class:`~.checks.JobRefused` (429) when
        ``waiting`` of her requests wait already."""
        if self.queued(name) > self.waiting:
            raise JobRefused(
                429,
                f"You have {self.queued(name)} job requests waiting for an answer; send the "
                "next one once they are answered.",
            )
        self._queued[name] = self.queued(name) + 1
        lock = self._locks.setdefault(name, asyncio.Lock())
        try:
            async with lock:
                loop = asyncio.get_running_loop()
                wait = self._last.get(name, -math.inf) + self.interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last[name] = loop.time()
                yield
        finally:
            self._queued[name] -= 1
            if not self._queued[name]:
                del self._queued[name], self._locks[name]


async def check_apart(fd: int, most: int) -> tuple[str, str]:
    """The verdict of :func:`hub_ext.jobs.notebook_check.verdict` on the file open as
    ``fd`` (at most ``most`` bytes) and the SHA-256 of what was checked, found in a child
    process (the same Python, isolated: ``-I -S``, at :data:`NICENESS`) that reads the
    file itself through ``fd``, at most :data:`CHECKS_AT_ONCE` at once.  A child that ends
    without a verdict (killed past its memory or CPU time) reads as ``too_big``."""
    loop = asyncio.get_running_loop()
    if loop not in _checks:
        _checks[loop] = asyncio.Semaphore(CHECKS_AT_ONCE)
    async with _checks[loop]:
        child = await asyncio.create_subprocess_exec(
            "nice",  # from its start (Python's own start-up included)
            "-n",
            str(NICENESS),
            sys.executable,
            "-I",
            "-S",
            notebook_check.__file__,
            str(fd),
            str(most),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            pass_fds=(fd,),
        )
        try:
            out, _ = await child.communicate()
        finally:
            if child.returncode is None:  # cancelled: the request went away
                child.kill()
                await child.wait()
    found, _, digest = out.decode(errors="replace").strip().partition(" ")
    return (found, digest) if found in notebook_check.VERDICTS else ("too_big", "")


def _read_hashed(fd: int, path: str, most: int) -> tuple[bytes, str]:
    data = read_open(fd, path, most)
    return data, hashlib.sha256(data).hexdigest()  # hashlib lets go of the GIL


async def load_notebook(workspace: str, path: str, max_bytes: int) -> bytes:
    """The bytes of the notebook ``path`` in ``workspace``: opened in a thread
    (:func:`~.checks.open_notebook`), checked in a child process (:func:`check_apart`),
    and only when it is a notebook read by the hub (in a thread).  Raises
    :class:`~.checks.JobRefused` (400, 403, 404, 413; 409 when it changed between the
    check and the read)."""
    fd = await asyncio.to_thread(open_notebook, workspace, path, max_bytes)
    try:
        found, checked = await check_apart(fd, max_bytes)
        refusal = notebook_refusal(found, path)
        if refusal is not None:
            raise refusal
        data, digest = await asyncio.to_thread(_read_hashed, fd, path, max_bytes)
    finally:
        os.close(fd)
    if digest != checked:
        raise JobRefused(
            409, f"{quote(path)} changed while the hub read it; save it and try again."
        )
    return data
