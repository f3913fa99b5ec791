"""What a course's instructor may reserve (admins are not bound), as pure rules.

An instructor manages a course's reservations through a role whose reservations scope is
filtered to the course's group (:mod:`hub_ext.courses.hubconfig`); an admin holds the scope
unfiltered and may reserve anything the hub's GPUs can hold.  What an instructor makes, or
adds by an edit, must:

- start no sooner than the warning time from now (``c.Reservations.warning``), so that the
  members whose servers hold the GPUs are warned first;
- last at most the course's ``max_reservation_hours`` per occurrence;
- end, each occurrence, within the course's ``max_days_ahead`` days from now (a weekly rule
  of 1000 occurrences every 3 weeks reaches 57 years ahead: refused);
- hold, with the course's other reservations, at most the course's ``max_reserved_gpus``
  units of its kind at once (whole GPUs, or MIG slices of one profile; by default half of
  the hub's, at least 1).

An edit that only gives back (every occurrence it leaves lies inside one the reservation
had, with no more units: a cancelled week, a shorter window, a new note) is always allowed,
so an instructor may trim what an admin made beyond the bounds.  A request beyond them is
refused (HTTP 403, :class:`OutOfBounds`) naming the bound, the numbers and the course's
field; an admin makes it instead, or raises the course's bounds in ``GPUHUB_COURSES``.

No database, no hub, no clock: the endpoints (:mod:`.handlers`) pass ``now``, the hub's
capacity and the course's other reservations.  Tested in
``tests/test_reservation_bounds.py``; the story is in docs "Reserve GPUs for a course".
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from traitlets import Dict
from traitlets.config import LoggingConfigurable

from ..culling.rules import duration
from .rules import Occurrence, Spec, describe, first_excess, occurrences, units_text

__all__ = [
    "DEFAULT_DAYS_AHEAD",
    "DEFAULT_HOURS",
    "Bounds",
    "OutOfBounds",
    "ReservationBounds",
    "added",
    "check_bounds",
]

#: hours one occurrence of an instructor's reservation may last, unless the course says
DEFAULT_HOURS = 8.0
#: days ahead an instructor's reservation may reach, unless the course says (a term)
DEFAULT_DAYS_AHEAD = 120


class OutOfBounds(ValueError):
    """Beyond what an instructor may reserve; ``str()`` says which bound, in words (HTTP
    403)."""


@dataclass(frozen=True)
class Bounds:
    """One course's bounds: ``label`` names it for people; ``max_gpus`` (None: half of the
    hub's units of the kind, at least 1), ``max_hours`` per occurrence, ``max_days_ahead``."""

    label: str
    max_gpus: int | None = None
    max_hours: float = DEFAULT_HOURS
    max_days_ahead: int = DEFAULT_DAYS_AHEAD

    def gpus(self, capacity: int) -> int:
        """The units of one kind the course may hold at once on a hub of ``capacity``."""
        return self.max_gpus if self.max_gpus is not None else max(1, capacity // 2)

    def summary(self, capacity: int, warning: float) -> str:
        """The bounds in one sentence, for the reservations page."""
        return (
            f"{self.label} may reserve up to {units_text(self.gpus(capacity), None)} at once, "
            f"{_hours(self.max_hours)} per occurrence, up to {self.max_days_ahead} days "
            f"ahead, starting at least {duration(warning)} from now. An admin may reserve more."
        )


class ReservationBounds(LoggingConfigurable):
    """The courses' bounds, by group (set from ``GPUHUB_COURSES``)."""

    courses = Dict(
        config=True,
        help="""An instructor's bounds per course group: group -> {"label",
        "max_reserved_gpus" (null: half the hub's), "max_reservation_hours",
        "max_days_ahead"}; set from GPUHUB_COURSES by hub_ext.courses.hubconfig.  A group
        not named here has the defaults (8 hours, 120 days, half the hub's GPUs).

            c.ReservationBounds.courses = {"ml101": {"label": "ML101",
                "max_reserved_gpus": 2, "max_reservation_hours": 4, "max_days_ahead": 120}}
        """,
    )

    def of(self, group: str) -> Bounds:
        """The bounds of ``group``'s course (the defaults for a group of no course)."""
        entry = self.courses.get(group) or {}
        return Bounds(
            label=entry.get("label") or group,
            max_gpus=entry.get("max_reserved_gpus"),
            max_hours=float(entry.get("max_reservation_hours") or DEFAULT_HOURS),
            max_days_ahead=int(entry.get("max_days_ahead") or DEFAULT_DAYS_AHEAD),
        )


def _hours(hours: float) -> str:
    return f"{hours:g} hour{'s' if hours != 1 else ''}"


def added(spec: Spec, before: Spec | None, now: datetime) -> list[Occurrence]:
    """What ``spec`` adds from ``now`` on to ``before`` (the reservation as stored; None
    for a new one), as occurrences: one that lies inside an occurrence of ``before`` of the
    same units with at least as many adds nothing; one that begins inside such an
    occurrence and ends later adds its extension (from that occurrence's end); any other
    is added whole."""
    mine = occurrences(spec, since=now)
    if before is None or before.units != spec.units:
        return mine
    had = occurrences(before, since=now)  # in order, never overlapping
    starts = [p.start for p in had]
    found = []
    for o in mine:
        i = bisect_right(starts, o.start) - 1
        p = had[i] if i >= 0 else None
        if p is None or o.start >= p.end or o.gpus > p.gpus:
            found.append(o)
        elif o.end > p.end:
            found.append(replace(o, start=p.end))  # longer: only its extension is new
    return found


def check_bounds(
    spec: Spec,
    before: Spec | None,
    group_specs: Iterable[Spec],
    bounds: Bounds,
    capacity: int,
    now: datetime,
    warning: float,
) -> None:
    """Raise :class:`OutOfBounds` when an instructor may not make ``spec`` (``before``:
    the stored reservation it edits, None for a new one); ``group_specs``: the group's
    reservations (``spec`` itself left out by id), ``capacity`` the hub's units of
    ``spec``'s kind, ``warning`` ``c.Reservations.warning`` in seconds.  Only the
    occurrences the request adds (:func:`added`) are checked."""
    new = added(spec, before, now)
    if not new:
        return
    label = bounds.label
    earliest = now + timedelta(seconds=warning)
    early = next((o for o in new if o.start < earliest), None)
    if early is not None:
        shown = earliest + timedelta(seconds=(-earliest.timestamp()) % 60)  # next minute
        raise OutOfBounds(
            f"An instructor's reservation starts at least {duration(warning)} from now, so "
            "that members whose servers hold the GPUs are warned first: this one starts "
            f"{describe(early.start)}. Start it at {describe(shown)} or later, or ask an "
            "admin."
        )
    if spec.duration > timedelta(hours=bounds.max_hours):
        raise OutOfBounds(
            f"{label}'s reservations last at most {_hours(bounds.max_hours)} per "
            f"occurrence; this one lasts {duration(spec.duration.total_seconds())}. Shorten "
            "it, or ask an admin (GPUHUB_COURSES field max_reservation_hours)."
        )
    horizon = now + timedelta(days=bounds.max_days_ahead)
    if new[-1].end > horizon:
        what = "its last occurrence ends" if spec.rrule else "it ends"
        raise OutOfBounds(
            f"{label}'s reservations reach at most {bounds.max_days_ahead} days ahead "
            f"(until {describe(horizon)}); {what} {describe(new[-1].end)}. "
            + ("Give a smaller COUNT or an earlier UNTIL" if spec.rrule else "Reserve sooner")
            + ", or ask an admin (GPUHUB_COURSES field max_days_ahead)."
        )
    limit = bounds.gpus(capacity)
    why = "" if bounds.max_gpus is not None else f", half of the hub's {capacity}"
    at_most = f"{label} may reserve at most {units_text(limit, spec.mig_profile)} at once{why}"
    if spec.gpus > limit:
        raise OutOfBounds(
            f"{at_most}; this reservation asks for {spec.gpus}. Ask an admin "
            "(GPUHUB_COURSES field max_reserved_gpus)."
        )
    others = [o for o in group_specs if o.units == spec.units and o.id != spec.id]
    excess = first_excess(new, others, limit, now)
    if excess is not None:
        names = "; ".join(
            f"reservation {o.reservation} ({units_text(o.gpus, spec.mig_profile)}, "
            f"{describe(o.start)} to {describe(o.end)})"
            for o in sorted(excess.at)
        )
        raise OutOfBounds(
            f"{at_most}; with {names} this one would hold {excess.need} at "
            f"{describe(excess.when)}. Ask an admin (GPUHUB_COURSES field "
            "max_reserved_gpus)."
        )
