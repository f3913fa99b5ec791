"""The courses' part of the hub's configuration: ``apply_courses_config(c, settings)``.

For each course of ``GPUHUB_COURSES`` a role ``gpuhub-course-<slug>``, given to its
instructors' groups, whose every scope is filtered to the course's group (JupyterHub RBAC,
``!group=`` filters; docs "JupyterHub RBAC: scopes"):

==========================================  =============================================
scope                                       what the instructor may do
==========================================  =============================================
``list:users``, ``read:users``              list the course's members, read their model
``read:servers``                            see their servers (running, pending, since)
``delete:servers``                          stop them (``DELETE /users/<name>/server``)
``list:groups``, ``read:groups``            read the course's group and its members
``admin-ui``                                open JupyterHub's admin page (it lists only
                                            the users the list scope allows)
``custom:gpuhub:gpus:read``                 the GPU board, other members' rows anonymous
``custom:gpuhub:reservations:admin``        the course's reservations
``custom:gpuhub:courses:grant``             grant course credits to its members
==========================================  =============================================

No ``access:servers``: an instructor does not enter a student's notebook.  The
instructors' groups may log in (added to the authenticator's ``allowed_groups``).
Called by :func:`hub_ext.config.apply_config` after the login and the GPU board.
"""

from __future__ import annotations

from ..common.services import define_scope
from ..reservations.budget import CourseBudget
from .courses import Course, load_courses

__all__ = ["GRANT_SCOPE", "ROLE_PREFIX", "apply_courses_config", "instructor_role"]

GRANT_SCOPE = "custom:gpuhub:courses:grant"
ROLE_PREFIX = "gpuhub-course-"
#: the hub's scopes an instructor holds, each filtered to the course's group
FILTERED_SCOPES = (
    "list:users",
    "read:users",
    "read:servers",
    "delete:servers",
    "list:groups",
    "read:groups",
    "custom:gpuhub:gpus:read",
    "custom:gpuhub:reservations:admin",
    GRANT_SCOPE,
)


def instructor_role(course: Course) -> dict:
    """The JupyterHub role of ``course``'s instructors (a ``load_roles`` entry)."""
    return {
        "name": ROLE_PREFIX + course.slug,
        "description": f"Instructors of {course.display_name}: its members, their servers, "
        "its reservations and credits",
        "scopes": [f"{scope}!group={course.group}" for scope in FILTERED_SCOPES] + ["admin-ui"],
        "groups": list(course.instructors),
    }


def apply_courses_config(c, settings) -> None:
    """Load ``settings.courses_file``, give each course's instructors their role and the
    right to log in, define the grant scope and hand the courses to the grant endpoint
    (``c.CourseGrants``), to the reservations' endpoints (``c.ReservationBounds``: what an
    instructor may reserve) and to the credits hook (``c.CreditsHook.course_payer``: the
    course budget, :mod:`hub_ext.reservations.budget`).  Raises OSError or ValueError
    (naming the file, course and field) for a file that cannot be read or is malformed."""
    courses = load_courses(settings.courses_file)
    define_scope(
        c,
        GRANT_SCOPE,
        "Grant course credits: move credits from a course's account to a "
        "member (filter with !group=<name> for one course).",
    )
    c.CourseGrants.courses = {
        slug: {
            "group": course.group,
            "account": course.account,
            "display_name": course.display_name,
            "self_grants": course.self_grants,
        }
        for slug, course in courses.items()
    }
    # what its instructors may reserve (hub_ext.reservations.bounds)
    c.ReservationBounds.courses = {
        course.group: {
            "label": course.display_name,
            "max_reserved_gpus": course.max_reserved_gpus,
            "max_reservation_hours": course.max_reservation_hours,
            "max_days_ahead": course.max_days_ahead,
        }
        for course in courses.values()
    }
    # the course budget: a course's account pays during its reservations' windows
    c.CreditsHook.course_payer = CourseBudget(c.CourseGrants.courses)
    # the reservations' sentences name a course's group by the course's display_name
    c.Reservations.labels = {course.group: course.display_name for course in courses.values()}
    if not courses:
        return
    if settings.credits and any(course.account for course in courses.values()):
        c.CourseGrants.admin_token = _admin_token(settings)
    roles = [
        r
        for r in (c.JupyterHub.load_roles if "load_roles" in c.JupyterHub else [])
        if not r.get("name", "").startswith(ROLE_PREFIX)
    ]
    c.JupyterHub.load_roles = roles + [instructor_role(course) for course in courses.values()]
    auth = c.CreditAuthenticator
    allowed = set(auth.allowed_groups) if "allowed_groups" in auth else set()
    for course in courses.values():
        allowed.update(course.instructors)
    auth.allowed_groups = allowed


def _admin_token(settings) -> str:
    """The Credits API's admin token: ``GPUHUB_CREDITS_ADMIN_TOKEN`` with an external
    ``GPUHUB_CREDITS_URL`` (empty: grants answer 503), else the managed reference service's
    token file in the state dir."""
    if settings.credits_url:
        return settings.credits_admin_token
    from pathlib import Path

    from ..common.services import token_file
    from ..credits.hubconfig import ADMIN_TOKEN_FILE

    return token_file(Path(settings.state_dir) / ADMIN_TOKEN_FILE)
