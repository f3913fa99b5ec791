"""Who pays for a server during a reservation's window: the course budget (issue 24, item 3).

While a window of a reservation of group G is open, a server of a member of G that holds a
unit *inside* the reservation (the group's servers, the earliest started first, fill its
units) is paid by the course whose ``group`` is G and which has an ``account``
(``GPUHUB_COURSES``), for every metering interval that *begins* before the window's end;
later intervals are the member's own, as before the window.  The decision is made once per
start (:func:`course_payer`) and kept in the credits hook's record
(:class:`hub_ext.credits.metering.MeterRecord`), so the meter, the stop's refund and a hub
restart all use the same account.  Story: docs "Reserve GPUs for a course", "Credits".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from .policy import Holding, Window, until_text

__all__ = ["CourseBudget", "CoursePayer", "course_payer", "inside_window", "may_pay"]


@dataclass(frozen=True)
class CoursePayer:
    """The course that pays: its ``slug``, ``display_name``, Credits API ``account``, and
    ``until`` (the window's end, aware UTC): intervals beginning before it are the
    course's; ``since`` and ``timezone``: the window's start and zone, for
    :meth:`until_text`."""

    slug: str
    display_name: str
    account: str
    until: datetime
    since: datetime | None = None
    timezone: str = "UTC"

    def until_text(self) -> str:
        """The window's end as people read it: "16:00 UTC", with the date when the window
        began on another day (:func:`hub_ext.reservations.policy.until_text`)."""
        return until_text(self.since or self.until, self.until, self.timezone)


def _payer(slug: str, course: Mapping, window: Window) -> CoursePayer:
    return CoursePayer(
        slug,
        course.get("display_name") or slug,
        course["account"],
        window.end,
        window.start,
        window.timezone,
    )


def _course_of(group: str, courses: Mapping[str, Mapping]) -> tuple[str, Mapping] | None:
    """The course (slug, entry) whose group is ``group`` and which has an account."""
    return next(
        ((slug, c) for slug, c in courses.items() if c.get("group") == group and c.get("account")),
        None,
    )


def inside_window(key, open_windows: list[Window], holdings: list[Holding]) -> Window | None:
    """The open window inside which the server ``key`` counts: it belongs to the window's
    group, and with the group's servers that started before it (by start, then key) it
    fits in the window's units."""
    mine = next((h for h in holdings if h.key == key), None)
    if mine is None:
        return None
    for window in open_windows:
        if window.units != mine.units or window.group not in mine.groups:
            continue
        used = 0
        for h in sorted(
            (h for h in holdings if h.units == window.units and window.group in h.groups),
            key=lambda h: (h.since, str(h.key)),
        ):
            if h.key == key:
                if used + h.count <= window.gpus:
                    return window
                break
            used += h.count
    return None


def course_payer(rules, key, courses: Mapping[str, Mapping]) -> CoursePayer | None:
    """The course that pays for server ``key`` (user, server name) now, or None (the
    member pays).  ``rules`` is the hub's
    :class:`hub_ext.reservations.enforce.Reservations` (its open windows and holdings);
    ``courses`` the ``c.CreditsHook.courses`` mapping slug -> {"group", "account",
    "display_name"}."""
    if rules is None or not courses or not rules.open:
        return None
    window = inside_window(key, rules.open, rules._holdings())
    if window is None:
        return None
    found = _course_of(window.group, courses)
    if found is None:
        return None
    return _payer(*found, window)


def may_pay(rules, user: str, courses: Mapping[str, Mapping]) -> CoursePayer | None:
    """Before any GPU is taken: a course that may pay for ``user``'s start (a window of a
    group of theirs is open and its course has an account), or None."""
    if rules is None or not courses:
        return None
    for window in rules.open:
        if user in rules.members.get(window.group, ()):
            found = _course_of(window.group, courses)
            if found is not None:
                return _payer(*found, window)
    return None


class CourseBudget:
    """``c.CreditsHook.course_payer``: ``(spawner, started) -> CoursePayer | None`` for
    the courses ``courses`` (slug -> {"group", "account", "display_name"}), read from the
    hub's :class:`hub_ext.reservations.enforce.Reservations`."""

    def __init__(self, courses: Mapping[str, Mapping]):
        self.courses = dict(courses)

    def __call__(self, spawner, started: bool) -> CoursePayer | None:
        from .enforce import Reservations

        if not self.courses or not Reservations.initialized():
            return None
        rules = Reservations.instance()
        if started:
            return course_payer(rules, (spawner.user.name, spawner.name or ""), self.courses)
        return may_pay(rules, spawner.user.name, self.courses)
