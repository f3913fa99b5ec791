"""The pure rules of reservations: reading a request, the occurrences of a reservation in a
window, and whether the hub's GPUs can hold every reservation at once.

No database, no hub, no clock of its own: the caller passes ``now`` and the hub's capacity
(:mod:`hub_ext.reservations.capacity`), so every rule is tested alone
(``tests/test_reservation_rules.py``).

A reservation is a :class:`Spec`: a JupyterHub group, ``gpus`` whole GPUs (or, with
``mig_profile``, that many MIG slices of that profile), a first occurrence from ``start`` to
``end`` and, optionally, an RFC 5545 recurrence rule (``rrule``, read by python-dateutil's
``rrulestr``) with exceptions (``exdates``: starts of occurrences that do not happen).
Times are aware datetimes; a recurrence repeats the first occurrence's wall-clock time in
the reservation's ``timezone`` (IANA name, "UTC" by default), so a lab at 14:00 in
Europe/Berlin stays at 14:00 across daylight-saving changes.

Errors are :class:`Invalid` (the request is wrong: HTTP 400) and :class:`Conflict` (right,
but the hub's GPUs cannot hold it beside the other reservations: HTTP 409), each with a
sentence for a person.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import rrule, rrulestr

__all__ = [
    "FIELDS",
    "MAX_OCCURRENCES",
    "Conflict",
    "Excess",
    "Invalid",
    "Occurrence",
    "Spec",
    "check_capacity",
    "describe",
    "first_conflict",
    "first_excess",
    "occurrences",
    "parse_spec",
    "parse_time",
    "units_text",
    "validate",
]

#: the fields a request may carry (POST: group, gpus, start and end are required)
FIELDS = ("group", "gpus", "mig_profile", "start", "end", "timezone", "rrule", "exdates", "note")
REQUIRED = ("group", "gpus", "start", "end")
#: the recurrences a reservation may have (a course meets daily or weekly)
FREQUENCIES = ("DAILY", "WEEKLY")
#: occurrences one reservation may have (a weekly lab for 19 years); bounds every check
MAX_OCCURRENCES = 1000
#: the longest one occurrence may last
MAX_DURATION = timedelta(days=31)
MAX_EXDATES = 200
NOTE_CHARS = 255
RRULE_CHARS = 512


class Invalid(ValueError):
    """The request cannot be a reservation; ``str()`` says why, in words (HTTP 400)."""


class Conflict(ValueError):
    """The reservation is valid but the hub's GPUs cannot hold it beside others (HTTP 409);
    ``str()`` names the time, the other reservations and the numbers; ``others``: their
    ids; ``groups``: their groups.  :meth:`told_to` is the sentence for one who may see
    only some groups' reservations."""

    def __init__(
        self,
        message: str,
        when: datetime,
        others: list[int],
        groups: frozenset[str] = frozenset(),
        hidden: str = "",
    ):
        super().__init__(message)
        self.when = when
        self.others = others
        self.groups = groups
        self.hidden = hidden or message

    def told_to(self, allowed: set[str] | None) -> str:
        """The sentence for one who manages the reservations of ``allowed`` (None: every
        group): the other reservations named (group, units, times) only when each is one
        they may see (a course's instructor gets 404 for another course's), else their own
        occurrence and how many units the others leave free, nothing named."""
        if allowed is None or self.groups <= set(allowed):
            return str(self)
        return self.hidden


@dataclass(frozen=True)
class Spec:
    """A reservation's rule (what is stored, less who made it and when).  ``start``,
    ``end`` and ``exdates`` are aware datetimes; ``id`` is None before it is stored."""

    group: str
    gpus: int
    start: datetime
    end: datetime
    mig_profile: str | None = None
    timezone: str = "UTC"
    rrule: str | None = None
    exdates: tuple[datetime, ...] = ()
    note: str = ""
    id: int | None = None

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    @property
    def units(self) -> str:
        """What it reserves: "gpu" (whole GPUs) or a MIG slice profile."""
        return self.mig_profile or "gpu"


@dataclass(frozen=True, order=True)
class Occurrence:
    """One window of a reservation, [start, end), aware UTC."""

    start: datetime
    end: datetime
    reservation: int | None = field(default=None, compare=False)
    gpus: int = field(default=0, compare=False)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise Invalid(
            f"timezone: no such time zone {name!r}; give an IANA name such as "
            "'UTC' or 'Europe/Berlin'"
        ) from None


def parse_time(value, what: str, zone: str = "UTC") -> datetime:
    """An ISO 8601 text as an aware UTC datetime; a time without an offset is read in
    ``zone``.  Raises :class:`Invalid` naming ``what``."""
    if not isinstance(value, str):
        raise Invalid(
            f"{what} must be an ISO 8601 date and time such as "
            f"'2026-12-01T14:00:00+01:00'; got {value!r}"
        )
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise Invalid(
            f"{what}: {value!r} is not an ISO 8601 date and time such as "
            "'2026-12-01T14:00:00+01:00'"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_zone(zone))
    return when.astimezone(UTC)


def parse_spec(body: dict, base: Spec | None = None) -> Spec:
    """A request body (POST: a whole reservation; PATCH: the fields to change on ``base``)
    as a :class:`Spec`, its types checked.  Raises :class:`Invalid` for a field that is not
    one of :data:`FIELDS`, a missing required field or a value of the wrong type."""
    if not isinstance(body, dict):
        raise Invalid("The body must be a JSON object with the fields " + ", ".join(FIELDS) + ".")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise Invalid(
            f"Unknown field(s): {', '.join(unknown)}. A reservation has: " + ", ".join(FIELDS) + "."
        )
    if base is None:
        missing = [f for f in REQUIRED if body.get(f) in (None, "")]
        if missing:
            raise Invalid(
                f"Missing: {', '.join(missing)}. A reservation needs a group, a "
                "number of GPUs, a start and an end."
            )
    values = {}
    if "group" in body:
        if not isinstance(body["group"], str) or not body["group"].strip():
            raise Invalid(f"group must be the name of a JupyterHub group; got {body['group']!r}")
        values["group"] = body["group"].strip()
    if "gpus" in body:
        gpus = body["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise Invalid(f"gpus must be a whole number from 1 up; got {gpus!r}")
        values["gpus"] = gpus
    if "mig_profile" in body:
        mig = body["mig_profile"]
        if mig is not None and (not isinstance(mig, str) or not mig.strip() or len(mig) > 64):
            raise Invalid(
                f"mig_profile must be a MIG profile such as '1g.5gb', or null for "
                f"whole GPUs; got {mig!r}"
            )
        values["mig_profile"] = mig.strip() if mig else None
    if "timezone" in body:
        if not isinstance(body["timezone"], str):
            raise Invalid(
                f"timezone must be an IANA name such as 'Europe/Berlin'; got {body['timezone']!r}"
            )
        _zone(body["timezone"])
        values["timezone"] = body["timezone"]
    zone = values.get("timezone", base.timezone if base else "UTC")
    for name in ("start", "end"):
        if name in body:
            values[name] = parse_time(body[name], name, zone)
    if "rrule" in body:
        rule = body["rrule"]
        if rule is not None and (not isinstance(rule, str) or len(rule) > RRULE_CHARS):
            raise Invalid(
                f"rrule must be an RFC 5545 rule such as "
                f"'FREQ=WEEKLY;BYDAY=TU;COUNT=12', or null; got {rule!r}"
            )
        values["rrule"] = (rule.strip() or None) if rule else None
    if "exdates" in body:
        exdates = body["exdates"]
        if exdates is None:
            exdates = []
        if not isinstance(exdates, list) or len(exdates) > MAX_EXDATES:
            raise Invalid(
                f"exdates must be a list (at most {MAX_EXDATES}) of the starts of "
                "occurrences that do not take place"
            )
        values["exdates"] = tuple(sorted({parse_time(x, "exdates", zone) for x in exdates}))
    if "note" in body:
        note = body["note"]
        if note is not None and (not isinstance(note, str) or len(note) > NOTE_CHARS):
            raise Invalid(f"note must be a text of at most {NOTE_CHARS} characters")
        values["note"] = note or ""
    if base is not None:
        return replace(base, **values)
    return Spec(**values)


def _rule(spec: Spec) -> rrule | None:
    """The recurrence as python-dateutil reads it, starting at ``spec.start`` in its zone."""
    if not spec.rrule:
        return None
    text = spec.rrule.removeprefix("RRULE:")
    parts = {}
    for part in text.split(";"):
        key, sep, value = part.partition("=")
        if not sep or "\n" in part:
            raise Invalid(
                f"rrule: cannot read {spec.rrule!r}: give one RFC 5545 rule such as "
                "'FREQ=WEEKLY;BYDAY=TU;COUNT=12' (no DTSTART: the start is the "
                "reservation's; exceptions go in exdates)"
            )
        parts[key.strip().upper()] = value.strip().upper()
    if parts.get("FREQ") not in FREQUENCIES:
        raise Invalid(
            f"rrule: FREQ must be one of {', '.join(FREQUENCIES)}; got {parts.get('FREQ')!r}"
        )
    if "COUNT" not in parts and "UNTIL" not in parts:
        raise Invalid(
            "rrule: a recurrence must end: give COUNT (how many times) or UNTIL "
            "(the last day, UTC, e.g. UNTIL=20270301T000000Z)"
        )
    try:
        return rrulestr(text, dtstart=spec.start.astimezone(_zone(spec.timezone)))
    except (ValueError, TypeError) as e:
        raise Invalid(f"rrule: cannot read {spec.rrule!r}: {e}") from None


def _starts(spec: Spec, rule: rrule | None) -> Iterator[datetime]:
    """Every occurrence's start, UTC, in order, exceptions left out (at most
    :data:`MAX_OCCURRENCES` + 1, so a caller can tell there are too many)."""
    if rule is None:
        if spec.start not in spec.exdates:
            yield spec.start
        return
    excepted = set(spec.exdates)
    for n, start in enumerate(rule):
        if n > MAX_OCCURRENCES:
            return
        start = start.astimezone(UTC)
        if start not in excepted:
            yield start


def occurrences(
    spec: Spec, since: datetime | None = None, until: datetime | None = None
) -> list[Occurrence]:
    """The occurrences of ``spec`` that overlap [since, until) (None: unbounded), in order;
    a rule that cannot be read raises :class:`Invalid`."""
    rule = _rule(spec)
    found = []
    for start in _starts(spec, rule):
        end = start + spec.duration
        if until is not None and start >= until:
            break
        if since is None or end > since:
            found.append(Occurrence(start, end, spec.id, spec.gpus))
    return found


def validate(spec: Spec, now: datetime, groups: Iterable[str], capacity: int) -> None:
    """Check ``spec`` alone: its group exists (``groups``: the hub's group names), its end
    is after its start, its recurrence can be read and occurs after ``now``, each exception
    is one of its occurrences, and ``capacity`` (the hub's GPUs, or MIG slices of
    ``spec.mig_profile``) is at least ``spec.gpus``.  Raises :class:`Invalid`."""
    groups = sorted(groups)
    if spec.group not in groups:
        some = ", ".join(groups[:20]) + (", ..." if len(groups) > 20 else "")
        raise Invalid(
            f"No such group: {spec.group!r}. "
            + (f"Groups include: {some}." if groups else "The hub has no groups yet.")
        )
    if spec.end <= spec.start:
        raise Invalid(
            f"The end ({describe(spec.end)}) must be after the start ({describe(spec.start)})."
        )
    if spec.duration > MAX_DURATION:
        raise Invalid(
            f"One occurrence may last at most {MAX_DURATION.days} days; this one "
            f"lasts {spec.duration}."
        )
    rule = _rule(spec)
    if rule is not None:
        first = next(iter(rule), None)
        if first is None or first.astimezone(UTC) != spec.start:
            raise Invalid(
                f"rrule {spec.rrule!r} does not occur at the start "
                f"({describe(spec.start)}): start the reservation on its first "
                "occurrence"
            )
        starts = list(_starts(replace(spec, exdates=()), rule))
        if len(starts) > MAX_OCCURRENCES:
            raise Invalid(
                f"rrule {spec.rrule!r} occurs more than {MAX_OCCURRENCES} times; "
                "give a smaller COUNT or an earlier UNTIL"
            )
        for a, b in zip(starts, starts[1:], strict=False):
            if b < a + spec.duration:
                raise Invalid(
                    f"The occurrences overlap: one starts {describe(b)}, before "
                    f"the one of {describe(a)} ends; shorten it or space them."
                )
        stray = [x for x in spec.exdates if x not in set(starts)]
    else:
        starts = [spec.start]
        stray = [x for x in spec.exdates if x != spec.start]
    if stray:
        raise Invalid(
            f"exdates: {describe(stray[0])} is not one of the reservation's "
            "occurrences (give the start of the occurrence that is cancelled)"
        )
    left = [s for s in starts if s not in set(spec.exdates)]
    if not left:
        raise Invalid("The reservation never occurs: every occurrence is in exdates.")
    if left[-1] + spec.duration <= now:
        raise Invalid(
            f"The reservation never occurs after now: its last occurrence ended "
            f"{describe(left[-1] + spec.duration)}."
        )
    what = f"{spec.mig_profile} MIG slices" if spec.mig_profile else "GPUs"
    if spec.gpus > capacity:
        raise Invalid(
            f"The hub has {capacity} {what}; a reservation of {spec.gpus} can never be met."
        )


@dataclass(frozen=True)
class Excess:
    """The first instant ``when`` at which ``mine`` (an occurrence being checked) and the
    occurrences ``at`` that are open then need ``need`` units, more than a limit."""

    when: datetime
    mine: Occurrence
    at: tuple[Occurrence, ...]
    need: int


def first_excess(
    mine_all: list[Occurrence], others: Iterable[Spec], limit: int, now: datetime
) -> Excess | None:
    """The first instant at or after ``now`` when one of ``mine_all`` (occurrences in
    order) and the occurrences of ``others`` (of the same units) open then need more than
    ``limit``; None when they never do.  The sum of units of occurrences that overlap only
    changes where one starts, so those instants are the ones checked."""
    if not mine_all:
        return None
    # every other occurrence that can meet one of mine, read once, by start
    theirs_all = sorted(
        o for other in others for o in occurrences(other, since=now, until=mine_all[-1].end)
    )
    starts = [o.start for o in theirs_all]
    for mine in mine_all:
        # an occurrence lasts at most MAX_DURATION: none that started earlier reaches mine
        low = bisect_left(starts, mine.start - MAX_DURATION)
        high = bisect_left(starts, mine.end)
        theirs = [o for o in theirs_all[low:high] if o.end > mine.start]
        first = max(mine.start, now)
        instants = sorted({first} | {o.start for o in theirs if o.start > first})
        for t in instants:
            at = tuple(o for o in theirs if o.start <= t < o.end)
            need = mine.gpus + sum(o.gpus for o in at)
            if need > limit:
                return Excess(t, mine, at, need)
    return None


def first_conflict(
    spec: Spec, others: Iterable[Spec], capacity: int, now: datetime
) -> Conflict | None:
    """The first instant at or after ``now`` when ``spec`` and the ``others`` that overlap
    it (same units: whole GPUs, or the same MIG profile; ``spec`` itself left out by id)
    need more than ``capacity`` (:func:`first_excess`); None when they fit."""
    others = [o for o in others if o.units == spec.units and (spec.id is None or o.id != spec.id)]
    excess = first_excess(occurrences(spec, since=now), others, capacity, now)
    if excess is None:
        return None
    return _conflict(spec, others, excess, capacity)


def units_text(n: int, mig_profile: str | None) -> str:
    """ "1 GPU", "2 GPUs", "3 1g.5gb MIG slices"."""
    what = f"{mig_profile} MIG slice" if mig_profile else "GPU"
    return f"{n} {what}{'s' if n != 1 else ''}"


def _conflict(spec: Spec, others: list[Spec], excess: Excess, capacity: int) -> Conflict:
    by_id = {o.id: o for o in others}
    at = sorted(excess.at)
    what = f"{spec.mig_profile} MIG slice" if spec.mig_profile else "GPU"
    names = "; ".join(
        f"reservation {o.reservation} ({by_id[o.reservation].group}, "
        f"{units_text(o.gpus, spec.mig_profile)}, {describe(o.start)} to {describe(o.end)})"
        for o in at
    )
    held = excess.need - spec.gpus
    # for one who may not see the others: their own occurrence and a count, no name
    hidden = (
        f"Not enough {what}s from {describe(excess.mine.start)} to "
        f"{describe(excess.mine.end)}: this reservation needs {spec.gpus} and other "
        f"reservations leave {capacity - held} free then; the hub has {capacity}. "
        "Ask an admin, who sees every reservation."
    )
    return Conflict(
        f"Not enough {what}s at {describe(excess.when)}: this reservation needs {spec.gpus} "
        f"and {names} hold{'s' if len(at) == 1 else ''} {held} then; the hub has "
        f"{capacity}.",
        excess.when,
        sorted({o.reservation for o in at}),
        groups=frozenset(by_id[o.reservation].group for o in at),
        hidden=hidden,
    )


def check_capacity(spec: Spec, others: Iterable[Spec], capacity: int, now: datetime) -> None:
    """Raise the :class:`Conflict` of :func:`first_conflict`, if any."""
    conflict = first_conflict(spec, others, capacity, now)
    if conflict is not None:
        raise conflict


def describe(when: datetime) -> str:
    """A time as people read it in messages: "Tue 2026-12-08 14:00 UTC"."""
    return when.astimezone(UTC).strftime("%a %Y-%m-%d %H:%M UTC")
