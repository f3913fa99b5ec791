"""After a hub restart: start the waiting spawns again, and keep the line moving.

JupyterHub forgets pending spawns when the hub stops (``kill -9`` included): at start-up it
finds their servers not running and clears them (JupyterHub ``init_spawners``).  The
places stay in the hub database (:mod:`hub_ext.line.store`), so the line's keeper asks the
hub, through its own REST API with the line service's token (``c.Line.api_token``), to
start each waiting server again (``POST /hub/api/users/<name>/servers/<server>`` with the
place's ``user_options`` and ``wait``), the way a member's browser would.  Each start finds
its place (same rank) and waits in it; until it does, the place blocks the ones behind it,
so the order after a restart is the order before.

The keeper also runs :meth:`hub_ext.line.Line.dispatch` every ``c.Line.update_interval``
seconds (a GPU that became healthy, or was freed outside a release) and ends places that
nobody waits in any more and that are past ``c.Line.max_wait``.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse

from ..common.clock import now
from ..common.periodic import ensure_task, every
from .core import Line

__all__ = ["ensure_keeper", "resume_places"]


def _server_path(api_url: str, user: str, server: str) -> str:
    path = f"{api_url.rstrip('/')}/users/{quote(user, safe='')}"
    return f"{path}/servers/{quote(server, safe='')}" if server else f"{path}/server"


async def _call(method: str, url: str, token: str, body: dict | None = None):
    request = HTTPRequest(
        url,
        method=method,
        headers={"Authorization": f"token {token}"},
        body=json.dumps(body) if body is not None else None,
        request_timeout=60,
    )
    return await AsyncHTTPClient().fetch(request, raise_error=False)


#: answers after which a restart's start is asked again, later (JupyterHub's spawn
#: limits, a service starting, no answer)
RETRY_CODES = (429, 503, 599)
#: seconds: the longest wait between two asks (the first is ``retry_delay``, doubling)
RETRY_MAX_DELAY = 30.0


async def resume_places(
    line: Line, api_url: str, timeout: float = 300, retry_delay: float = 1.0
) -> None:
    """Start the spawn of every place nobody waits in (a restart), in the line's order.

    A place whose server runs already (it started just before the hub stopped) is
    forgotten; one whose start the hub refuses (the member was deleted, the profile
    removed) is ended; one refused for now (429, 503, no answer) is asked again after
    ``retry_delay`` seconds, doubling up to ``RETRY_MAX_DELAY``, while its place lasts
    (``Line.max_wait``).  Waits up to ``timeout`` seconds for the hub's API to answer first.
    """
    token = line.api_token
    if not token:
        if line.places:
            line.log.warning(
                "c.Line.api_token is not set: %d waiting place(s) kept from "
                "before the restart cannot be started again",
                len(line.places),
            )
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            r = await _call("GET", f"{api_url.rstrip('/')}/", token)
            if r.code == 200:
                break
        except (OSError, HTTPClientError):
            pass
        if loop.time() > deadline:
            line.log.error("The hub API did not answer; the line is not resumed")
            return
        await asyncio.sleep(0.5)

    async def respawn(place):
        if place.waiter is not None:
            return
        body = {"user_options": {**place.user_options, "wait": True}}
        url = _server_path(api_url, *place.key)
        delay = retry_delay
        while True:
            try:
                r = await _call("POST", url, token, body)
            except (OSError, HTTPClientError) as e:
                r = HTTPResponse(HTTPRequest(url), 599, error=e)
            # 429: JupyterHub's concurrent_spawn_limit or active_server_limit; 503: a
            # service not up yet (the credits' before_reserve check); 599: no answer.
            # The place is kept while it may still be kept (its max_wait).
            # 400 "is pending": the server is still being checked after the restart
            # (JupyterHub's init_spawners polls it), asked again in a moment
            checking = r.code == 400 and b"is pending" in (r.body or b"")
            if (
                (r.code not in RETRY_CODES and not checking)
                or place.key not in line.places
                or (now() + delay > place.queued_at + line.max_wait)
            ):
                break
            line.log.info(
                "Start of %s refused for now (%s); again in %.0f s", place.key, r.code, delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_DELAY)
        if r.code == 400 and b"already running" in (r.body or b""):
            line.places.pop(place.key, None)
            line.granted[place.key] = place
            line.forget(place.key)
        elif r.code in RETRY_CODES and place.key in line.places:
            line.log.warning(
                "Could not start %s again after a restart (%s) within its "
                "place's time; the keeper ends it when it expires",
                place.key,
                r.code,
            )
        elif r.code not in (201, 202) and place.key in line.places:
            line.remove(place.key, "removed", "Your place could not be kept.")
            line.log.error(
                "Could not start %s again after a restart (%s): %s",
                place.key,
                r.code,
                (r.body or b"")[:300],
            )
        else:
            line.log.info("Started %s's waiting spawn again after a restart", place.key)

    await asyncio.gather(*(respawn(p) for p in line.ordered()))


_keeper: asyncio.Task | None = None


def ensure_keeper(line: Line, api_url: str) -> None:
    """Start the keeper once per hub process (needs a running event loop)."""
    global _keeper

    async def keep():
        # resumed beside the checks: a start refused for now is asked again later
        resuming = asyncio.ensure_future(resume_places(line, api_url))
        await every(lambda: line.update_interval, tick, line.log, "The line's check")
        await resuming

    async def tick():
        line.dispatch()
        line.announce_soon()  # the estimates and the time left move on
        for place in line.ordered():
            if place.waiter is None and now() > place.queued_at + line.max_wait:
                line.remove(place.key, "expired", "Your place expired.")

    _keeper = ensure_task(_keeper, keep)
