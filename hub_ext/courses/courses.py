"""``GPUHUB_COURSES``: the site's courses, one JSON file read and checked once.

The file is a JSON object, one entry per course, its key the course's slug::

    {"ml101": {"display_name": "ML101", "group": "ml101",
               "instructors": ["ml101-instructors"], "account": "course-ml101"}}

- ``group``: the JupyterHub group of its students (from the identity provider's groups);
- ``instructors``: identity-provider groups whose members are its instructors (at least one);
- ``display_name``: how pages name it (default: the slug);
- ``account``: the course's account in the Credits API (optional: no course credits).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..credits.contract import username_problem

__all__ = ["Course", "load_courses"]

#: a course's slug: it names a role (``gpuhub-course-<slug>``) and a URL path segment
SLUG = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
#: a JupyterHub group name as it can appear in a ``!group=`` filter and a URL
GROUP = re.compile(r"[^/\s!,]{1,255}")
FIELDS = {"display_name", "group", "instructors", "account"}


@dataclass(frozen=True)
class Course:
    """One course: its ``slug``, the students' ``group``, the ``instructors``' groups and
    the Credits API ``account`` (None: the course has no credits of its own)."""

    slug: str
    display_name: str
    group: str
    instructors: tuple[str, ...]
    account: str | None = None


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
    return Course(
        slug=slug,
        display_name=display_name.strip(),
        group=group,
        instructors=tuple(dict.fromkeys(instructors)),
        account=account,
    )
