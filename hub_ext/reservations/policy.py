"""The rules of an enforced reservation, as pure functions: how many units are closed to a
member now, whose servers must stop for a window, and what people read about it.

No database, no hub, no clock: :class:`hub_ext.reservations.enforce.Reservations` passes
the windows (:func:`windows`, from the stored rules), the servers holding units
(:class:`Holding`) and the free units it read, and acts on the answers; the backends' pools
(the Docker pool's refusal, the line's grants) ask :func:`closed_units`.  Tested alone in
``tests/test_reservation_policy.py``.

The rules (issue 24):

- while a window of group G for N units is open, N units of its kind are closed to
  everyone not in G, less the units G's members hold already (a member's server that
  started before the window counts inside it): G's members draw from the reservation
  first and from the shared pool after;
- at a window's start, when the free units cannot cover what the open windows still need,
  servers of members of none of those groups are stopped, the most recently started
  first, and only as many as the shortfall needs (a free unit is used before anyone is
  stopped);
- the same reckoning a warning time ahead names the servers to warn;
- a server is never stopped without its warning (:func:`stop_at`): one that ran when the
  hub could first warn of a window (its start less the warning time, or the reservation's
  creation if later) is stopped no sooner than the warning time after it was warned, so a
  window made to begin at once (an admin may) stops nobody before then; one started after
  that was told at its start until when it may run, and is stopped at the window's start.

The sentences carry the date ("from Tue 2026-12-08 14:00 UTC to 16:00 UTC"; the end's date
too when it falls on another day).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from .rules import Spec, occurrences

__all__ = [
    "Holding",
    "Window",
    "closed_units",
    "due",
    "open_at",
    "reason",
    "runs_into",
    "span_text",
    "starts_text",
    "stop_at",
    "to_stop",
    "until_text",
    "windows",
]


@dataclass(frozen=True)
class Window:
    """One occurrence of a reservation, [start, end) aware UTC: ``gpus`` units of kind
    ``units`` ("gpu", or a MIG profile) for the members of ``group``; ``label`` is the
    name people read (a course's display name, else the group's); ``timezone`` the
    reservation's, for the times in sentences; ``made`` when the reservation was made
    (aware UTC; None: long ago), the earliest the hub could warn of it."""

    reservation: int | None
    group: str
    label: str
    units: str
    gpus: int
    start: datetime
    end: datetime
    timezone: str = "UTC"
    made: datetime | None = None

    def noticed(self, warning: float) -> datetime:
        """When the hub first warns of this window: ``warning`` seconds before its start,
        or when the reservation was made if that is later."""
        first = self.start - timedelta(seconds=warning)
        return max(first, self.made) if self.made is not None else first


@dataclass(frozen=True)
class Holding:
    """A server holding units: ``count`` units of kind ``units`` since ``since`` (seconds
    since the epoch), of ``user``, a member of ``groups`` (only the groups of windows
    that matter are needed)."""

    key: object
    user: str
    units: str
    count: int
    since: float
    groups: frozenset[str] = frozenset()


def windows(
    specs: Iterable[Spec],
    since: datetime,
    until: datetime,
    label: Callable[[str], str] = str,
    made: Callable[[int | None], datetime | None] = lambda _: None,
) -> list[Window]:
    """The windows of ``specs`` overlapping [since, until), by start; ``label(group)``
    names a group for people, ``made(reservation id)`` says when it was made.  A rule that
    cannot be read is skipped (it was checked when stored)."""
    found = []
    for spec in specs:
        try:
            occurring = occurrences(spec, since=since, until=until)
        except ValueError:
            continue
        found += [
            Window(
                spec.id,
                spec.group,
                label(spec.group),
                spec.units,
                spec.gpus,
                o.start,
                o.end,
                spec.timezone,
                made(spec.id),
            )
            for o in occurring
        ]
    return sorted(found, key=lambda w: (w.start, w.reservation or 0))


def open_at(found: Iterable[Window], when: datetime) -> list[Window]:
    """The windows open at ``when``."""
    return [w for w in found if w.start <= when < w.end]


def _inside(window: Window, holdings: Iterable[Holding]) -> int:
    """Units of the window's kind its group's members hold."""
    return sum(h.count for h in holdings if h.units == window.units and window.group in h.groups)


def closed_units(
    open_windows: Iterable[Window], groups: Iterable[str], units: str, holdings: Iterable[Holding]
) -> tuple[int, list[tuple[Window, int]]]:
    """Units of kind ``units`` closed to a member of ``groups``: for each open window of
    that kind whose group is not one of ``groups``, its units less those its members hold.
    Returns (the sum, [(window, units it closes)] of the windows that close any)."""
    groups = set(groups)
    holdings = list(holdings)
    closing = []
    for window in open_windows:
        if window.units != units or window.group in groups:
            continue
        left = max(0, window.gpus - _inside(window, holdings))
        if left:
            closing.append((window, left))
    return sum(n for _, n in closing), closing


def to_stop(
    open_windows: Sequence[Window], holdings: Iterable[Holding], free: Callable[[str], int]
) -> list[tuple[Holding, Window]]:
    """The servers to stop so that ``open_windows`` can be met, each with the window it
    makes room for: per kind of unit, the units the windows still need (less what their
    members hold) beyond the free ones (``free(units)``), taken from servers of members of
    none of those windows' groups, the most recently started first, and no more than the
    shortfall needs."""
    holdings = list(holdings)
    chosen = []
    for units in sorted({w.units for w in open_windows}):
        mine = [w for w in open_windows if w.units == units]
        needs = [(w, max(0, w.gpus - _inside(w, holdings))) for w in mine]
        shortfall = sum(n for _, n in needs) - free(units)
        if shortfall <= 0:
            continue
        groups = {w.group for w in mine}
        window = next(w for w, n in needs if n)
        others = sorted(
            (h for h in holdings if h.units == units and not groups & h.groups),
            key=lambda h: (-h.since, str(h.key)),
        )
        for holding in others:
            if shortfall <= 0:
                break
            chosen.append((holding, window))
            shortfall -= holding.count
    return chosen


def due(
    found: Sequence[Window],
    holdings: Iterable[Holding],
    free: Callable[[str], int],
    now: datetime,
    ahead: float,
) -> dict[object, Window]:
    """The servers that will be stopped at a window starting after ``now`` and within
    ``ahead`` seconds, as things stand: server key -> the first such window."""
    holdings = list(holdings)
    warned: dict[object, Window] = {}
    for start in sorted({w.start for w in found if 0 < (w.start - now).total_seconds() <= ahead}):
        for holding, window in to_stop(open_at(found, start), holdings, free):
            warned.setdefault(holding.key, window)
    return warned


def stop_at(window: Window, since: float, warned: datetime, warning: float) -> datetime:
    """The earliest a server that holds units ``window`` needs may be stopped for it, never
    before its warning: ``since`` is when the server started (seconds since the epoch),
    ``warned`` when the hub first warned it of this stop, ``warning`` the warning time in
    seconds (``c.Reservations.warning``).

    A server started after the hub could first warn of the window
    (:meth:`Window.noticed`) and before its start was told at its start until when it may
    run (:func:`runs_into`): the window's start.  Any other is stopped no sooner than the
    later of the window's start and ``warning`` seconds after ``warned``."""
    noticed = window.noticed(warning)
    if noticed.timestamp() <= since <= window.start.timestamp():
        return window.start
    return max(window.start, warned + timedelta(seconds=warning))


def runs_into(
    found: Iterable[Window], groups: Iterable[str], units: str, now: datetime
) -> Window | None:
    """The first window of kind ``units`` of a group not in ``groups`` that starts after
    ``now``: a server started now by a member of ``groups`` may be stopped then."""
    groups = set(groups)
    later = [w for w in found if w.units == units and w.group not in groups and w.start > now]
    return min(later, key=lambda w: w.start, default=None)


def _clock(when: datetime, zone: str, date: bool = False) -> str:
    local = when.astimezone(ZoneInfo(zone))
    return f"{local:{'%a %Y-%m-%d %H:%M' if date else '%H:%M'}} {local.tzname()}"


def until_text(start: datetime, end: datetime, zone: str = "UTC") -> str:
    """The end of a window that began at ``start``, as sentences write it: "16:00 UTC" when
    it ends on the day it began (in ``zone``), else with its date: "Thu 2027-01-07 22:34
    UTC"."""
    tz = ZoneInfo(zone)
    return _clock(end, zone, date=start.astimezone(tz).date() != end.astimezone(tz).date())


def span_text(start: datetime, end: datetime, zone: str = "UTC") -> str:
    """ "from Tue 2026-12-08 14:00 UTC to 16:00 UTC" (:func:`until_text` for the end)."""
    return f"from {_clock(start, zone, date=True)} to {until_text(start, end, zone)}"


def _units(n: int, units: str) -> str:
    what = "GPU" if units == "gpu" else f"{units} GPU slice"
    return f"{n} {what}{'s' if n != 1 else ''}"


def reason(closing: Sequence[tuple[Window, int]]) -> str:
    """What a non-member reads about units closed to them: "2 GPUs reserved for ML101
    until 16:00 UTC" (the end's date too when the window began on another day; several
    windows joined by "and")."""
    return " and ".join(
        f"{_units(n, w.units)} reserved for {w.label} until "
        f"{until_text(w.start, w.end, w.timezone)}"
        for w, n in closing
    )


def starts_text(window: Window) -> str:
    """ "1 GPU is reserved for ML101 from Tue 2026-12-08 14:00 UTC to 16:00 UTC"."""
    verb = "is" if window.gpus == 1 else "are"
    return (
        f"{_units(window.gpus, window.units)} {verb} reserved for {window.label} "
        f"{span_text(window.start, window.end, window.timezone)}"
    )
