"""``GPUHUB_COURSES``: the site's courses, one JSON file read and checked once.

The file is a JSON object, one entry per course, its key the course's slug::

    {"ml101": {"display_name": "ML101", "group": "ml101",
               "instructors": ["ml101-instructors"], "account": "course-ml101"}}

- ``group``: the JupyterHub group of its students (from the identity provider's groups);
- ``instructors``: identity-provider groups whose members are its instructors (at least one);
- ``display_name``: how pages name it (default: the slug);
- ``account``: the course's account in the Credits API (optional: no course credits);
- ``max_reserved_gpus``: the GPUs (or MIG slices of one profile) its instructors may reserve
  at once (default: half of the hub's, at least 1);
- ``max_reservation_hours``: how long one occurrence of their reservation may last (default
  8);
- ``max_days_ahead``: how far ahead their reservations may reach (default 120 days);
- ``self_grants``: whether an instructor may grant the course's credits to themselves
  (default false).

Admins are held to none of these (:mod:`hub_ext.reservations.bounds`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..credits.contract import username_problem
from ..reservations.bounds import DEFAULT_DAYS_AHEAD, DEFAULT_HOURS
from ..reservations.rules import MAX_DURATION

__all__ = ["Course", "load_courses"]

#: a course's slug: it names a role (``gpuhub-course-<slug>``) and a URL path segment
SLUG = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
#: a JupyterHub group name as it can appear in a ``!group=`` filter and a URL
GROUP = re.compile(r"[^/\s!,]{1,255}")
FIELDS = {
    "display_name",
    "group",
    "instructors",
    "account",
    "max_reserved_gpus",
    "max_reservation_hours",
    "max_days_ahead",
    "self_grants",
}
#: the farthest ahead a course's bound may let its instructors reserve (about 2 years)
MAX_DAYS_AHEAD = 730


@dataclass(frozen=True)
class Course:
    """One course: its ``slug``, the students' ``group``, the ``instructors``' groups, the
    Credits API ``account`` (None: the course has no credits of its own), what its
    instructors may reserve (``max_reserved_gpus``, None: half the hub's;
    ``max_reservation_hours``; ``max_days_ahead``) and whether they may grant its credits
    to themselves (``self_grants``)."""

    slug: str
    display_name: str
    group: str
    instructors: tuple[str, ...]
    account: str | None = None
    max_reserved_gpus: int | None = None
    max_reservation_hours: float = DEFAULT_HOURS
    max_days_ahead: int = DEFAULT_DAYS_AHEAD
    self_grants: bool = False


def load_courses(path: str) -> dict[str, Course]:
    """The courses of the JSON file ``path``, by slug, in the file's order.

    Raises OSError when the file cannot be read and ValueError naming the file, the
    course and the field for anything malformed (not JSON, an unknown or missing field, a
    wrong type, an instructors' group that is also the students' group, two courses of one
    group).  An empty path gives no courses.
    """
    if not path:
        return {}
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: must be a JSON object of courses, e.g. "
            '{"ml101": {"group": "ml101", "instructors": ["ml101-instructors"]}}'
        )
    courses: dict[str, Course] = {}
    for slug, entry in data.items():
        course = _course(path, slug, entry)
        for other in courses.values():
            if other.group == course.group:
                raise ValueError(
                    f"{path}: course {slug!r}: group: {course.group!r} is "
                    f"already the group of course {other.slug!r}"
                )
        courses[slug] = course
    return courses


def _course(path: str, slug: str, entry: object) -> Course:
    def bad(field: str, what: str) -> ValueError:
        return ValueError(f"{path}: course {slug!r}: {field}: {what}")

    if not SLUG.fullmatch(slug):
        raise ValueError(
            f"{path}: course {slug!r}: a course's key is 1 to 63 lowercase "
            "letters, digits, - or _, starting with a letter or digit"
        )
    if not isinstance(entry, dict):
        raise ValueError(
            f"{path}: course {slug!r}: must be a JSON object with group and instructors"
        )
    unknown = sorted(set(entry) - FIELDS)
    if unknown:
        raise bad(unknown[0], f"unknown field; fields are {', '.join(sorted(FIELDS))}")
    group = entry.get("group")
    if not isinstance(group, str) or not GROUP.fullmatch(group):
        raise bad(
            "group",
            "the students' JupyterHub group is required, a name without spaces, '/', '!' or ','",
        )
    instructors = entry.get("instructors")
    if (
        not isinstance(instructors, list)
        or not instructors
        or not all(isinstance(g, str) and GROUP.fullmatch(g) for g in instructors)
    ):
        raise bad("instructors", 'a non-empty list of group names, e.g. ["ml101-instructors"]')
    if group in instructors:
        raise bad(
            "instructors", f"{group!r} is the students' group: its members would all be instructors"
        )
    display_name = entry.get("display_name", slug)
    if not isinstance(display_name, str) or not display_name.strip():
        raise bad("display_name", "a non-empty text")
    account = entry.get("account")
    if account is not None:
        problem = username_problem(account) if isinstance(account, str) else "must be a text"
        if problem:
            raise bad("account", f"a Credits API account name: {problem}")
    gpus = entry.get("max_reserved_gpus")
    if gpus is not None and (not _whole(gpus) or gpus < 1):
        raise bad("max_reserved_gpus", f"a whole number of GPUs from 1 up, or null; got {gpus!r}")
    hours = entry.get("max_reservation_hours", DEFAULT_HOURS)
    longest = MAX_DURATION.total_seconds() / 3600
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 < hours <= longest:
        raise bad(
            "max_reservation_hours",
            f"hours one occurrence may last, more than 0 and at most {longest:g}; got {hours!r}",
        )
    days = entry.get("max_days_ahead", DEFAULT_DAYS_AHEAD)
    if not _whole(days) or not 1 <= days <= MAX_DAYS_AHEAD:
        raise bad(
            "max_days_ahead", f"a whole number of days from 1 to {MAX_DAYS_AHEAD}; got {days!r}"
        )
    self_grants = entry.get("self_grants", False)
    if not isinstance(self_grants, bool):
        raise bad("self_grants", f"true or false; got {self_grants!r}")
    return Course(
        slug=slug,
        display_name=display_name.strip(),
        group=group,
        instructors=tuple(dict.fromkeys(instructors)),
        account=account,
        max_reserved_gpus=gpus,
        max_reservation_hours=float(hours),
        max_days_ahead=days,
        self_grants=self_grants,
    )


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
