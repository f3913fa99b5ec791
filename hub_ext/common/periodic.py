"""Background passes of the hub process: the reconciliation, the credits meter, the culler.

Each runs as one asyncio task per hub process, started by the first spawner that needs it
(there is no hub start-up hook for extensions), on the hub's own event loop.

They stop at the start of the hub's shutdown (:func:`stop_passes_first`), before
JupyterHub stops its managed services: a pass would otherwise go on calling the credits
service JupyterHub has just stopped, retrying with back-off, until JupyterHub cancels every
task at the end of its clean-up.  A pass under way then is given up to
:data:`SHUTDOWN_GRACE` seconds to end, and cancelled after that; a metering pass cancelled
in the middle of a debit loses nothing, because the next hub debits that interval again
under the same Idempotency-Key (:mod:`hub_ext.credits.metering`) and the service answers
with the first debit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

#: Seconds a pass under way at shutdown may take to end before it is cancelled.
SHUTDOWN_GRACE = 2.0

#: The passes of this process while they run, and those of them inside a pass now.
_tasks: set[asyncio.Task] = set()
_in_pass: set[asyncio.Task] = set()
_stopping = False


def shutting_down() -> bool:
    """Whether this hub process has begun to shut down (:func:`stop_passes` ran): a task
    cancelled now is cancelled by the shutdown, not by a member."""
    return _stopping


def ensure_task(
    task: asyncio.Task | None, make: Callable[[], Awaitable[None]]
) -> asyncio.Task | None:
    """``task`` while it runs, else a new task of ``make()`` on the running event loop.

    Without a running loop (a config check, a unit test), or once the hub shuts down
    (:func:`stop_passes`), nothing starts and ``task`` is returned as it is.
    """
    if task is not None and not task.done():
        return task
    if _stopping:
        return task
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return task
    new = loop.create_task(make())
    _tasks.add(new)
    new.add_done_callback(_tasks.discard)
    return new


async def every(
    seconds: Callable[[], float],
    step: Callable[[], Awaitable[None]],
    log: logging.Logger,
    what: str,
    *,
    first_now: bool = False,
) -> None:
    """Run ``step()`` every ``seconds()`` seconds until the hub shuts down; a failed pass
    is logged with its traceback and the next one comes as planned.  ``first_now``: the
    first pass at once rather than after one interval."""
    if not first_now:
        await asyncio.sleep(seconds())
    current = asyncio.current_task()
    while not _stopping:
        _in_pass.add(current)
        try:
            await step()
        except Exception:
            log.exception("%s failed; trying again in %gs", what, seconds())
        finally:
            _in_pass.discard(current)
        if _stopping:
            return
        await asyncio.sleep(seconds())


async def stop_passes(log: logging.Logger, grace: float = SHUTDOWN_GRACE) -> None:
    """Stop every pass of this process and start no new one: those waiting for their next
    pass at once, those inside a pass when it ends or after ``grace`` seconds, whichever
    comes first (then cancelled).  Never raises."""
    global _stopping
    _stopping = True
    tasks = [t for t in _tasks if not t.done()]
    busy = [t for t in tasks if t in _in_pass]
    log.info(
        "Stopping the hub's %d periodic passes (%d under way, given up to %gs)",
        len(tasks),
        len(busy),
        grace,
    )
    for task in tasks:
        if task not in _in_pass:
            task.cancel()
    if busy:
        _, late = await asyncio.wait(busy, timeout=grace)
        for task in late:
            log.warning(
                "Cancelling a periodic pass still under way at shutdown: %s", task.get_coro()
            )
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def stop_passes_first(app) -> None:
    """Make the JupyterHub application ``app`` stop the passes before anything else when
    it shuts down.

    JupyterHub (6.1) has no shutdown hook for extensions; its ``cleanup()`` is the first
    step of each way it shuts down (``shutdown_cancel_tasks`` on SIGTERM or SIGINT,
    ``atexit`` on Windows) and begins by stopping the managed services, so ``app``'s
    ``cleanup`` is wrapped to run :func:`stop_passes` first.  Wrapping twice is a no-op.
    """
    cleanup = app.cleanup
    if getattr(cleanup, "stops_passes_first", False):
        return

    async def cleanup_after_the_passes():
        await stop_passes(app.log)
        await cleanup()

    cleanup_after_the_passes.stops_passes_first = True
    app.cleanup = cleanup_after_the_passes


def after_start(app, mark: str, then: Callable[[], None]) -> None:
    """Make the JupyterHub application ``app`` call ``then()`` once its ``start`` is done
    (the proxy and the API up; ``app.users`` filled by ``initialize``).  JupyterHub (6.1)
    has no start-up hook for extensions, so ``app.start`` is wrapped; ``mark`` names the
    wrapper, and wrapping twice with one ``mark`` is a no-op."""
    start = app.start
    if getattr(start, mark, False):
        return

    async def start_then():
        await start()
        then()

    setattr(start_then, mark, True)
    app.start = start_then
