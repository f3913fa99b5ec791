"""Background passes of the hub process: the reconciliation, the credits meter, the culler.

Each runs as one asyncio task per hub process, started by the first spawner that needs it
(there is no hub start-up hook for extensions), on the hub's own event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable


def ensure_task(task: asyncio.Task | None,
                make: Callable[[], Awaitable[None]]) -> asyncio.Task | None:
    """``task`` while it runs, else a new task of ``make()`` on the running event loop.

    Without a running loop (a config check, a unit test) nothing starts and ``task`` is
    returned as it is.
    """
    if task is not None and not task.done():
        return task
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return task
    return loop.create_task(make())


async def every(seconds: Callable[[], float], step: Callable[[], Awaitable[None]],
                log: logging.Logger, what: str, *, first_now: bool = False) -> None:
    """Run ``step()`` every ``seconds()`` seconds, forever; a failed pass is logged with
    its traceback and the next one comes as planned.  ``first_now``: the first pass at
    once rather than after one interval."""
    if not first_now:
        await asyncio.sleep(seconds())
    while True:
        try:
            await step()
        except Exception:
            log.exception("%s failed; trying again in %gs", what, seconds())
        await asyncio.sleep(seconds())
