"""The turn of each place: freed units granted to the heads of the lines, and the waiting told.

:class:`Turns` is a part of :class:`hub_ext.line.core.Line` (a mixin; the line holds the
traits, ``places``, ``granted``, ``backend`` and the places' steps ``remove`` and
``forget``).  A spawn awaits its turn in :meth:`Turns.wait_turn`; :meth:`Turns.dispatch`
asks the backend for its free units and grants them, in the order of
:func:`hub_ext.line.order.grants` (backfill after ``c.Line.backfill_age`` seconds), without
an await in between, so nobody arriving meanwhile can take them; every waiting member's page
is then told their new place (:meth:`Turns.announce_soon`, 50 at a time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..common import clock, metrics
from ..common.periodic import shutting_down
from .order import Waiting, grants

__all__ = ["Turns"]


class Turns:
    """The turns of :class:`hub_ext.line.core.Line`'s places."""

    async def wait_turn(self, key, on_update: Callable[[dict], None]):
        """Wait until the backend grants ``key``'s place; returns the grant.

        ``on_update(self.describe(key))`` is called at once and whenever the place changes
        (a grant ahead, a removal, and every ``update_interval`` seconds from the line's
        keeper: the estimate and the time left).  Raises :class:`LineLeft` when the place
        ends otherwise (left, removed, expired).  Cancelled (the member stopped the pending
        server), the place ends too.
        """
        place = self.places[key]
        place.waiter = asyncio.get_running_loop().create_future()
        place.on_update = on_update
        try:
            on_update(self.describe(key))
            self.dispatch()
            left = place.queued_at + self.max_wait - clock.now()
            # asyncio.wait, not wait_for: under Python 3.11 wait_for returns the result of
            # a waiter granted alongside the task's cancellation (bpo-42130), and the stop
            # would be lost; asyncio.wait raises it and leaves the waiter as it is.
            done, _ = await asyncio.wait({place.waiter}, timeout=max(left, 0))
            if not done:
                within = (
                    f"{self.max_wait:g} s" if self.max_wait < 60 else f"{self.max_wait / 60:g} min"
                )
                self.remove(
                    key,
                    "expired",
                    f"Your place in line for {place.profile_name} "
                    f"expired: no GPU freed within {within}. "
                    "Try again later or pick another profile.",
                )
            grant = place.waiter.result()  # raises LineLeft
        except asyncio.CancelledError:
            if shutting_down():
                # JupyterHub cancels every task at the end of its clean-up: the place is
                # not given up, its row stays and the next hub takes it up in its order
                # (:mod:`hub_ext.line.resume`)
                self.places.pop(key, None)
                self.granted.pop(key, None)
                self.log.info(
                    "%s keeps its place in line for %s through the hub's shutdown",
                    key,
                    place.profile,
                )
            elif key in self.places:
                self.remove(key, "stopped", "The pending server was stopped.")
            elif self.granted.get(key) is place:  # granted, then cancelled before it woke
                self.forget(key)
                if not place.waiter.cancelled() and place.waiter.exception() is None:
                    self.backend.ungrant(place, place.waiter.result())
            place.waiter.cancel()  # nobody awaits it any more
            raise
        finally:
            place.waiter = place.on_update = None
        metrics.LINE_WAIT.labels(profile=place.profile).observe(
            max(0.0, clock.now() - place.queued_at)
        )
        return grant

    def dispatch(self) -> None:
        """Grant freed units to the heads of the lines, now (no await: nobody arriving in
        between can take them).  Called when units free, a place joins or leaves, and every
        ``update_interval`` seconds."""
        if self.backend is None or not self.places or self._dispatching:
            return
        self._dispatching = True  # a grant may release (and so dispatch) again
        try:
            if self._dispatch():
                self.announce_soon()
        finally:
            self._dispatching = False
        self._update_metrics()

    def announce_soon(self) -> None:
        """Tell every waiting member their new place, once the current step is over (a
        grant is never held up by the page updates)."""
        if self._announcing is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._announcing = loop.call_soon(self._announce)

    def _announce(self, todo: list | None = None, kinds: dict | None = None) -> None:
        """Call the waiting places' ``on_update``, 50 at a time, so that a long line
        never holds the event loop for long."""
        if todo is None:
            self._announcing = None
            todo, kinds = list(self.places.values()), {}
        for place in todo[:50]:
            if place.on_update is not None and place.key in self.places:
                place.on_update(self.describe(place.key, kinds))
        if todo[50:]:
            asyncio.get_running_loop().call_soon(self._announce, todo[50:], kinds)

    def _dispatch(self) -> bool:
        """One pass of :meth:`dispatch`; True when anything was granted."""
        granted_any = False
        now = clock.now()

        def fit(waiting: Waiting) -> bool:
            return self.backend.fits(self.places[waiting.key])

        for units in {p.units for p in self.places.values()}:
            line = self.ordered(units)
            waiting = [
                Waiting(
                    p.key, p.count, now - p.queued_at, p.waiter is not None and not p.waiter.done()
                )
                for p in line
            ]
            for key in grants(waiting, self.backend.free_units(units), self.backfill_age, fits=fit):
                place = self.places[key]
                grant = self.backend.grant(place)
                if grant is None:
                    break
                del self.places[key]
                self.granted[key] = place
                place.waiter.set_result(grant)
                granted_any = True
                self.log.info(
                    "%s's turn: granted %s after %.1fs in line", key, grant, now - place.queued_at
                )
        return granted_any
