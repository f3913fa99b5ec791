"""The line of members waiting for GPUs: places, their order, and the turn of each.

One :class:`Line` per hub process (``Line.instance()``), shared by every spawner and the
line's endpoints.  It is backend-neutral: what "free units" and "a grant" mean is asked of
a *backend* (:class:`LineBackend`): the Docker backend's pool hands a freed GPU to the
head of the line (:mod:`hub_ext.docker.line`); a Slurm backend, where a pending job is the
place in line, needs none of the granting and uses the order and the sentences.

A place is a pending spawn: the spawner's ``start()`` joins the line and awaits its turn
(:meth:`Line.wait_turn`); it holds no GPU and no debit while it waits.  The places are
mirrored in the hub database (:mod:`hub_ext.line.store`), so a restart keeps them and their
order; :mod:`hub_ext.line.resume` starts their spawns again.  This module holds the places
and their steps (join, remove, started, front); their order and descriptions are in
:mod:`hub_ext.line.view`, the grants and the waiting in :mod:`hub_ext.line.turn`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy.exc import IntegrityError
from traitlets import Float, Unicode, default
from traitlets.config import SingletonConfigurable

from ..common import clock, metrics
from ..common.traits import Positive
from . import store
from .place import LineBackend, LineLeft, LineRefused, Place
from .turn import Turns
from .view import LineView

__all__ = ["Line", "LineBackend", "LineLeft", "LineRefused", "Place"]


class Line(Turns, LineView, SingletonConfigurable):
    """The waiting places of every member, by kind of unit, in order."""

    max_wait = Positive(
        3600.0,
        config=True,
        help="""Seconds a place is kept at most; then it expires and the member is told.

            c.Line.max_wait = 2 * 3600
        """,
    )

    fair_share_days = Float(
        0.0,
        min=0.0,
        config=True,
        help="""Fair share: a member who used fewer GPU-hours in this many past days goes
        ahead of those who used more (from the run records); 0 is first come, first served.

            c.Line.fair_share_days = 7
        """,
    )

    backfill_age = Float(
        900.0,
        min=0.0,
        config=True,
        help="""Seconds a request that does not fit in the free units (2 GPUs asked, 1
        free) lets smaller requests behind it start first; after that nobody passes it.
        0 is strict order.

            c.Line.backfill_age = 900
        """,
    )

    update_interval = Positive(
        5.0,
        config=True,
        help="""Seconds between updates of a waiting member's place and estimate on the
        progress page, and between the line's own checks for free units.

            c.Line.update_interval = 5
        """,
    )

    typical_run = Positive(
        3600.0,
        config=True,
        help="""Seconds a server is taken to run when its profile has no maximum age and
        no culler timeout, for the wait estimate only.

            c.Line.typical_run = 3600
        """,
    )

    api_token = Unicode(
        "",
        config=True,
        help="""Token of the hub service that starts the waiting servers again after a
        hub restart (set by hub_ext.config from the state dir).

            c.Line.api_token = open("/srv/gpuhub/line-token").read().strip()
        """,
    )

    @default("log")
    def _default_log(self):
        from traitlets import log

        return log.get_logger()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.places: dict[tuple, Place] = {}
        self.granted: dict[tuple, Place] = {}  # granted, row kept until the start ends
        self._joining: dict[tuple, Place] = {}  # being written to the database
        self.db = None
        self.writer: store.Writer | None = None
        self.backend: LineBackend | None = None
        self._dispatching = False
        self._last_rank = 0.0
        self._announcing: asyncio.Handle | None = None
        self._seen: set[str] = set()  # profiles with a line-length series

    # -- the places ---------------------------------------------------------------------

    def attach(self, db, backend: LineBackend | None = None) -> None:
        """Use the hub database ``db`` (a SQLAlchemy session) and ``backend``; loads the
        places kept there on the first call (a hub restart)."""
        if backend is not None:
            self.backend = backend
        if self.db is not None or db is None:
            return
        self.db = db
        self.writer = store.Writer(db)
        for row in store.load_rows(db):
            place = Place.of(row)
            self.places[place.key] = place
        if self.places:
            self.log.info(
                "The line has %d place(s) kept from before the restart: %s",
                len(self.places),
                ", ".join(str(k) for k in self.ordered_keys()),
            )
        self._update_metrics()

    async def join(
        self,
        key,
        *,
        profile: str,
        profile_name: str,
        units: str,
        count: int,
        user_options: dict,
        share_hours: float = 0.0,
    ) -> Place:
        """A place for server ``key``, at the end of the line, once it is in the hub
        database; the same place again when it has one (a spawn started again after a
        hub restart).

        Raises :class:`LineRefused` when this server is joining already, when the
        member waits for this profile (or has a start of it granted and still starting)
        with another server, or when the hub database holds a row for this server or
        for this member and profile already (``uq_gpuhub_line_profile``).  Cancelled
        while its row is written, the row is deleted after (nothing is left behind).
        """
        place = self.places.get(key)
        if place is not None:
            return place
        if key in self._joining:
            raise LineRefused("joining", "This server is joining the line already.")
        self.check_one_place(key, profile, profile_name)
        rank = (
            max((p.rank for p in [*self.places.values(), *self._joining.values()]), default=0.0) + 1
        )
        rank = max(rank, self._last_rank + 1)
        self._last_rank = rank
        place = Place(
            key,
            profile,
            profile_name,
            units,
            count,
            dict(user_options),
            clock.now(),
            rank,
            share_hours=share_hours,
        )
        # counted at once (a second join for this profile is refused), in the line only
        # once its row is in the database: nobody is told of a place a crash could lose
        self._joining[key] = place
        queued_at = datetime.fromtimestamp(place.queued_at, UTC).replace(tzinfo=None)
        try:
            await self.writer.submit(
                store.insert_row,
                {
                    "username": key[0],
                    "server_name": key[1],
                    "profile": profile,
                    "profile_name": profile_name,
                    "units": units,
                    "count": count,
                    "user_options": place.user_options,
                    "queued_at": queued_at,
                    "rank": rank,
                    "share_hours": share_hours,
                },
            )
        except IntegrityError as e:  # a row of this server or member and profile is there
            raise LineRefused(
                "one_per_profile",
                f"You are already in line for {profile_name}; each member has "
                "one place per profile.",
            ) from e
        except asyncio.CancelledError:
            # the insert may still be committed by the writer: delete it after (in order)
            self._write(store.delete_row, *key)
            raise
        finally:
            del self._joining[key]
        self.places[key] = place
        self._update_metrics()
        self.log.info(
            "%s joined the line for %d %s (profile %s) as %d of %d",
            key,
            count,
            units,
            profile,
            self.position(key),
            self.waiting(units),
        )
        return place

    def check_one_place(self, key, profile: str, profile_name: str) -> None:
        """Raise :class:`LineRefused` when ``key``'s member waits for ``profile`` with
        another server already, or has one granted and still starting (one place per
        member per profile)."""
        other = next(
            (
                p
                for p in [*self.places.values(), *self._joining.values(), *self.granted.values()]
                if p.key[0] == key[0] and p.profile == profile and p.key != key
            ),
            None,
        )
        if other is not None:
            where = f"server '{other.key[1]}'" if other.key[1] else "your default server"
            raise LineRefused(
                "one_per_profile",
                f"You are already in line for {profile_name} ({where}); "
                "each member has one place per profile.",
            )

    def remove(self, key, reason: str, message: str) -> Place | None:
        """End ``key``'s place without a turn (``reason``: left, removed, expired,
        stopped); a waiting spawn fails with :class:`LineLeft` and ``message``.  Commits;
        idempotent."""
        place = self.places.pop(key, None) or self.granted.pop(key, None)
        if place is None:
            return None
        self._write(store.delete_row, *key)
        if place.waiter is not None and not place.waiter.done():
            place.waiter.set_exception(LineLeft(reason, message))
        self.log.info("%s left the line for %s (%s)", key, place.profile, reason)
        self._update_metrics()
        self.dispatch()  # the place ahead is gone: backfill may start someone
        self.announce_soon()
        return place

    def forget(self, key) -> None:
        """A granted place's start ended (started, or failed): delete its row.  Idempotent."""
        place = self.granted.pop(key, None)
        if place is not None:
            self._write(store.delete_row, *key)

    def started(self, key) -> Place | None:
        """The backend's scheduler started ``key``'s server itself (Slurm ran its job):
        the place ends, its row is deleted and the places behind move up.  Returns the
        place (None when it had none); idempotent."""
        place = self.places.pop(key, None)
        if place is None:
            return None
        self._write(store.delete_row, *key)
        metrics.LINE_WAIT.labels(profile=place.profile).observe(
            max(0.0, clock.now() - place.queued_at)
        )
        self.log.info(
            "%s's turn: started by the scheduler after %.1fs in line",
            key,
            clock.now() - place.queued_at,
        )
        self._update_metrics()
        self.announce_soon()
        return place

    def move_to_front(self, key) -> bool:
        """Put ``key``'s place ahead of every other of its kind (an admin's choice).
        Commits.  False when it has no place."""
        place = self.places.get(key)
        if place is None:
            return False
        ranks = [p.rank for p in self.places.values()]
        place.front, place.rank = True, min(ranks) - 1
        self._write(store.move_row, *key, place.rank)
        self.log.info("%s moved to the front of the line for %s", key, place.profile)
        self.dispatch()
        self.announce_soon()
        return True

    def _write(self, write, *args) -> None:
        """Mirror a change in the hub database, in the background (in order)."""
        future = self.writer.submit(write, *args)
        future.add_done_callback(self._written)

    async def written(self) -> None:
        """Wait until every change made so far is in the hub database."""
        if self.writer is not None:
            await self.writer.submit(lambda session: None)

    def _written(self, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.log.error(
                "The line could not be written to the hub database: %s", future.exception()
            )
