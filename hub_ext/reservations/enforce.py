"""Reservations enforced in the hub process: the windows open now, the warning before one,
the stop at its start, and the closure the pool and the line consult.

One :class:`Reservations` per hub process (``Reservations.instance()``), backend-neutral:
what "a server holding units" and "free units" mean is asked of a
:class:`ReservationBackend` (the Docker pool: :mod:`hub_ext.docker.pool_reservations`;
Slurm's reserved nodes and the hub's jobs on them: :mod:`hub_ext.slurm.enforce`);
the rules themselves are :mod:`hub_ext.reservations.policy`.  The pool stays the one
authority over who holds which GPU: this module only tells it how many units are closed
to a member now (:meth:`Reservations.closed_to`), so nothing is ever double-booked
across a window's boundary.

Every ``c.Reservations.check_interval`` seconds, and at each window's start, end and
warning time, a pass (:meth:`Reservations.check_once`):

- reads the reservations (``gpuhub_reservations``) and the windows open now or starting
  within the warning time, and the members of their groups (JupyterHub's groups);
- stops, with reason ``reservation`` (the run record, :mod:`hub_ext.common.runs`), the servers
  the open windows need (:func:`hub_ext.reservations.policy.to_stop`), through the hub's
  normal stop (:func:`hub_ext.spawn.stopping.stop_server`: the credits hook refunds the unused
  part of the paid interval), each no sooner than its warning allows
  (:func:`hub_ext.reservations.policy.stop_at`: ``c.Reservations.warning`` seconds after it
  was warned, when it was not told at its start; a window that begins at once stops nobody
  before then);
- warns on the home page (:mod:`hub_ext.common.notices`, topic ``reservation``) the servers a
  window starting within ``c.Reservations.warning`` seconds will need, and those an open
  window needs whose warning time is not up yet;
- when the open windows changed (one began or ended), asks the backend to hand the units
  to the line at once (:meth:`ReservationBackend.changed`).

The pass checks state, not edges: a hub killed at a window's start stops the servers at
its first pass after the restart.  When each server was warned is kept in the process; a
restarted hub takes a server that ran when the hub could first warn of the window
(:meth:`~hub_ext.reservations.policy.Window.noticed`) as warned then, by the hub before it,
and warns any other afresh.  Time comes from ``c.Reservations.utcnow``.
"""

from __future__ import annotations

import asyncio
from collections import abc
from dataclasses import replace
from datetime import datetime, timedelta

from traitlets import Callable, Dict, Float, default, validate
from traitlets.config import SingletonConfigurable

from ..common.clock import utcnow
from ..common.notices import notices
from ..common.periodic import ensure_task, every
from ..culling.rules import duration
from ..spawn.stopping import stop_server
from . import store
from .policy import (
    Holding,
    Window,
    closed_units,
    due,
    open_at,
    reason,
    runs_into,
    starts_text,
    stop_at,
    to_stop,
    windows,
)

__all__ = ["TOPIC", "ReservationBackend", "Reservations"]

#: notices topic of the reservations' warnings and stops
TOPIC = "reservation"
#: how far ahead a start is told of the next window that may stop it
NOTICE_AHEAD = timedelta(hours=12)


class ReservationBackend:
    """What the enforcement asks of a backend.  :meth:`holdings` and :meth:`free_units`
    are required; :meth:`read`, :meth:`held` and :meth:`changed` are optional (default:
    nothing to read, the window's own count, nothing to do)."""

    def holdings(self) -> list[tuple]:
        """(ServerKey, units, count, since) per server holding units: ``units`` "gpu" or a
        MIG profile, ``since`` seconds since the epoch; servers the hub cannot stop (a
        container it has no server for) left out."""
        raise NotImplementedError

    def free_units(self, units: str) -> int:
        """Units of this kind free now, without waiting."""
        raise NotImplementedError

    async def read(self) -> None:
        """Optional: bring the free units up to date before a pass (may wait on a worker
        thread, never on the event loop); raise to skip the pass (the units cannot be
        read: nobody is stopped on a guess).  Default: nothing to read."""

    def held(self, window: Window) -> int:
        """Optional: the units the backend holds for ``window``, when it cannot hold
        exactly the window's count (Slurm reserves whole nodes: their GPUs); the rules
        then count the window with these.  Default: ``window.gpus``."""
        return window.gpus

    def changed(self) -> None:
        """Optional: a window began or ended; hand what it freed to the line now."""


class Reservations(SingletonConfigurable):
    """The reservations' windows, enforced (see the module docstring)."""

    warning = Float(
        900.0,
        config=True,
        help="""Seconds before a reservation's window from which a member whose server
        holds a GPU the window needs is warned on the home page (it is stopped at the
        start); the line also keeps such GPUs from members who are not in the group.

            c.Reservations.warning = 900
        """,
    )

    check_interval = Float(
        15.0,
        config=True,
        help="""Seconds between the reservations' passes (besides one at each window's
        warning, start and end).

            c.Reservations.check_interval = 15
        """,
    )

    labels = Dict(
        config=True,
        help="""How sentences name a reservation's group: group -> name people read (a
        course's display_name; set from GPUHUB_COURSES by hub_ext.courses.hubconfig).
        A group not named here is named as it is.

            c.Reservations.labels = {"ml101": "ML101"}
        """,
    )

    utcnow = Callable(
        config=True,
        help="""The clock: a function returning the current time as an aware UTC datetime.
        Tests replace it to move time.

            c.Reservations.utcnow = hub_ext.common.clock.utcnow
        """,
    )

    @default("utcnow")
    def _default_utcnow(self):
        return utcnow

    @validate("warning", "check_interval")
    def _check_seconds(self, proposal):
        value, name = proposal["value"], proposal["trait"].name
        if value < 0 or (name == "check_interval" and value == 0):
            raise ValueError(
                f"c.Reservations.{name} must be a positive number of seconds, got {value!r}"
            )
        return value

    @default("log")
    def _default_log(self):
        from traitlets import log

        return log.get_logger()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.backend: ReservationBackend | None = None
        self.db = None
        self.users = None  # JupyterHub's UserDict
        #: the windows open now, starting within the warning time, within NOTICE_AHEAD
        self.open: list[Window] = []
        self.soon: list[Window] = []
        self.ahead: list[Window] = []
        self.members: dict[str, set[str]] = {}
        #: server key -> when this process first warned it that it will be stopped
        self._warned_at: dict[object, datetime] = {}
        self._began: datetime | None = None  # this process's first pass
        self._stopped: set = set()  # told they were stopped; withdrawn when they restart
        self._stopping: set = set()
        self._next: float = 0.0
        self._task: asyncio.Task | None = None

    def now(self) -> datetime:
        return self.utcnow()

    def attach(self, backend: ReservationBackend, db, users) -> None:
        """Use ``backend``, the hub database session ``db`` and JupyterHub's users
        (``UserDict``); start the passes (needs a running event loop)."""
        self.backend = self.backend or backend
        if self.db is None and db is not None:
            self.db = db
        if self.users is None and users is not None:
            self.users = users
        self._task = ensure_task(
            self._task,
            lambda: every(self._interval, self.check_once, self.log, "Reservations pass"),
        )

    # -- what the pool and the line ask --------------------------------------------------

    def groups_of(self, user: str) -> frozenset[str]:
        """The groups of current windows that ``user`` is a member of."""
        return frozenset(g for g, names in self.members.items() if user in names)

    def _holdings(self) -> list[Holding]:
        if self.backend is None:
            return []
        return [
            Holding(key, key[0], units, count, since, self.groups_of(key[0]))
            for key, units, count, since in self.backend.holdings()
        ]

    def closed_to(self, user: str, units: str, soon: bool = False) -> tuple[int, str]:
        """Units of kind ``units`` closed to ``user`` now (``soon``: and by the windows
        starting within the warning time, for the line's grants), and the sentence that
        says why ("1 GPU reserved for ML101 until 16:00 UTC"; "" when none is closed)."""
        found = self.open + (self.soon if soon else [])
        if not found:
            return 0, ""
        closed, closing = closed_units(found, self.groups_of(user), units, self._holdings())
        return closed, reason(closing)

    def held_back(self) -> list[str]:
        """Per open window, for the GPU board: "1 GPU reserved for ML101 until 16:00 UTC
        (1 held by its members)"."""
        holdings = self._holdings()
        out = []
        for w in self.open:
            inside = sum(h.count for h in holdings if h.units == w.units and w.group in h.groups)
            out.append(f"{reason([(w, w.gpus)])} ({inside} held by its members)")
        return out

    def member_first(self, user: str, units: str) -> bool:
        """``user`` belongs to a group whose window of kind ``units`` is open: their place
        in line goes ahead of the others."""
        return any(w.units == units and user in self.members.get(w.group, ()) for w in self.open)

    def next_stop(
        self, user: str, units: str, needs: abc.Callable[[Window], bool] | None = None
    ) -> Window | None:
        """The next window (within 12 h) that a server of ``user`` holding ``units`` may be
        stopped for: a start is told how long it can run (:meth:`start_notice`).
        ``needs(window)``: whether the window may need this server's units (the Slurm
        backend: a GPU on its reserved nodes); by default every window of their kind may."""
        found = [w for w in self.ahead if needs is None or needs(w)]
        return runs_into(found, self.groups_of(user), units, self.now())

    def start_notice(self, window: Window) -> str:
        """What a start's progress says of :meth:`next_stop`'s window: "1 GPU is reserved
        for ML101 from 14:00 UTC to 16:00 UTC: this server may run until then (about
        40 min from now) and is stopped at the start if the reservation needs its GPU."."""
        left = (window.start - self.now()).total_seconds()
        return (
            f"{starts_text(window)}: this server may run until then (about "
            f"{duration(left)} from now) and is stopped at the start if the reservation "
            "needs its GPU."
        )

    # -- the pass ------------------------------------------------------------------------

    def _interval(self) -> float:
        return max(0.05, min(self.check_interval, self._next))

    async def check_once(self) -> None:
        """One pass (see the module docstring)."""
        if self.db is None or self.backend is None:
            return
        try:
            await self.backend.read()
        except Exception as e:  # noqa: BLE001 - the next pass tries again
            self.log.warning("Reservations pass skipped: the GPUs cannot be read: %s", e)
            return
        now = self.now()
        if self._began is None:
            self._began = now
        self._read(now)
        holdings = self._holdings()
        chosen = {h.key: (h, w) for h, w in to_stop(self.open, holdings, self.backend.free_units)}
        by_key = {h.key: h for h in holdings}
        soon = due(self.soon, holdings, self.backend.free_units, now, self.warning)
        warn: dict[object, tuple[Window, datetime]] = {}
        for key, (holding, window) in chosen.items():
            when = stop_at(
                window, holding.since, self._warned_since(holding, window, now), self.warning
            )
            if when > now:
                warn[key] = (window, when)  # not before its warning time is up
            elif key not in self._stopping:
                self._stopping.add(key)
                asyncio.ensure_future(self._stop(holding, window))
        for key, window in soon.items():
            if key not in chosen:
                holding = by_key[key]
                since = self._warned_since(holding, window, now)
                warn[key] = (window, stop_at(window, holding.since, since, self.warning))
        for key, (window, when) in warn.items():
            if key not in self._warned_at:
                self._warned_at[key] = now
                self.log.info(
                    "Warned %s: stopped at %s for reservation %s of %s (%s)",
                    key,
                    when.isoformat(),
                    window.reservation,
                    window.group,
                    starts_text(window),
                )
            left = (when - now).total_seconds()
            self._next = min(self._next, left)
            notices().post(
                key[0],
                key[1],
                TOPIC,
                f"Your {_server(key)} will be stopped in "
                f"about {duration(left)}: {starts_text(window)}, and it holds a "
                "GPU they need. Save your work.",
            )
        for key in set(self._warned_at) - set(warn) - set(chosen):  # no longer needed
            if key not in self._stopping | self._stopped:  # else "was stopped" stays
                notices().withdraw(key[0], key[1], TOPIC)
            del self._warned_at[key]
        for key in self._stopped & {h.key for h in holdings}:  # started again
            notices().withdraw(key[0], key[1], TOPIC)
            self._stopped.discard(key)

    def _warned_since(self, holding: Holding, window: Window, now: datetime) -> datetime:
        """When ``holding``'s server was first warned that it will be stopped: as this
        process recorded it; for a server that ran when the hub first could warn of
        ``window`` before this process began, then (the hub before it warned it); else
        now (it is warned in this pass)."""
        if holding.key in self._warned_at:
            return self._warned_at[holding.key]
        noticed = window.noticed(self.warning)
        if (
            self._began is not None
            and noticed < self._began
            and holding.since < noticed.timestamp()
        ):
            return noticed
        return now

    def _read(self, now: datetime) -> None:
        """The windows of the stored reservations around ``now``, their groups' members,
        and when the next pass must come (a warning, a start or an end)."""
        from jupyterhub import orm

        was = {(w.reservation, w.start) for w in self.open}
        rows = store.load(self.db)
        made = {row.id: store.made_at(row) for row in rows}
        found = windows(
            [store.to_spec(row) for row in rows],
            now,
            now + max(NOTICE_AHEAD, timedelta(seconds=self.warning)),
            label=lambda group: self.labels.get(group, group),
            made=made.get,
        )
        found = [replace(w, gpus=self.backend.held(w)) for w in found]
        self.open = open_at(found, now)
        self.soon = [w for w in found if 0 < (w.start - now).total_seconds() <= self.warning]
        self.ahead = found
        groups = {w.group for w in found}  # all: no member is told of her own group's
        self.members = {
            g.name: {u.name for u in g.users}
            for g in self.db.query(orm.Group).filter(orm.Group.name.in_(groups))
        }
        self.db.commit()  # end the read transaction
        edges = [
            t for w in found for t in (w.start - timedelta(seconds=self.warning), w.start, w.end)
        ]
        self._next = min(
            [(t - now).total_seconds() for t in edges if t > now] + [self.check_interval]
        )
        if {(w.reservation, w.start) for w in self.open} != was:
            self.log.info(
                "Reservation windows open now: %s",
                ", ".join(
                    f"{w.group} ({w.gpus} {w.units} until {w.end.isoformat()})" for w in self.open
                )
                or "none",
            )
            self.backend.changed()

    async def _stop(self, holding: Holding, window: Window) -> None:
        """Stop ``holding``'s server for ``window``; never raises."""
        key = holding.key
        try:
            user = self.users[key[0]] if self.users is not None else None
            spawner = user.spawners.get(key[1]) if user is not None else None
            if spawner is None or spawner.pending or not spawner.ready:
                return  # a start or stop under way: the next pass sees it again
            sentence = f"{starts_text(window)}, and your server held a GPU they need"
            self.log.warning(
                "Stopping %s (GPUs %d %s) for reservation %s of %s (%s)",
                key,
                holding.count,
                holding.units,
                window.reservation,
                window.group,
                starts_text(window),
            )
            spawner.stop_detail = sentence
            try:
                await stop_server(spawner, "reservation")
            finally:
                spawner.stop_detail = None
            notices().post(key[0], key[1], TOPIC, f"Your {_server(key)} was stopped: {sentence}.")
            self._stopped.add(key)
        except Exception:
            self.log.exception("Could not stop %s for reservation %s", key, window.reservation)
        finally:
            self._stopping.discard(key)


def _server(key) -> str:
    return f"server '{key[1]}'" if key[1] else "server"
