"""Courses without a hub: ``GPUHUB_COURSES`` read and checked, and the instructors' roles
``apply_config`` gives (the hub-level checks are in ``test_courses_hub.py``)."""

from __future__ import annotations

import json

import pytest
from traitlets.config import Config

from hub_ext.config import apply_config
from hub_ext.courses import Course, load_courses
from tests.test_config import settings_from

ML101 = {
    "display_name": "ML101",
    "group": "ml101",
    "instructors": ["ml101-instructors"],
    "account": "course-ml101",
}


def write(tmp_path, data) -> str:
    path = tmp_path / "courses.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_courses_are_read_by_slug(tmp_path):
    path = write(
        tmp_path, {"ml101": ML101, "ml102": {"group": "ml102", "instructors": ["ml102-staff"]}}
    )
    assert load_courses(path) == {
        "ml101": Course("ml101", "ML101", "ml101", ("ml101-instructors",), "course-ml101"),
        "ml102": Course("ml102", "ml102", "ml102", ("ml102-staff",), None),
    }


def test_a_course_bounds_its_instructors_reservations_with_defaults(tmp_path):
    path = write(
        tmp_path,
        {
            "ml101": {
                **ML101,
                "max_reserved_gpus": 2,
                "max_reservation_hours": 3.5,
                "max_days_ahead": 200,
                "self_grants": True,
            },
            "ml102": {"group": "ml102", "instructors": ["ml102-staff"]},
        },
    )
    courses = load_courses(path)
    ml101, ml102 = courses["ml101"], courses["ml102"]
    assert (ml101.max_reserved_gpus, ml101.max_reservation_hours, ml101.max_days_ahead) == (
        2,
        3.5,
        200,
    )
    assert ml101.self_grants
    # the defaults: half the hub's GPUs (None), 8 hours, 120 days; no grant to oneself
    assert (ml102.max_reserved_gpus, ml102.max_reservation_hours, ml102.max_days_ahead) == (
        None,
        8.0,
        120,
    )
    assert not ml102.self_grants


def bad_field(name: str, value, words: str):
    """ML101 with one field's value wrong, and the words naming it."""
    return pytest.param(
        {"ml101": {**ML101, name: value}}, f"course 'ml101': {name}: {words}", id=f"bad-{name}"
    )


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param("{", "not JSON", id="not-json"),
        pytest.param([ML101], "must be a JSON object of courses", id="a-list"),
        pytest.param({"ML 101": ML101}, "course 'ML 101': a course's key is", id="bad-slug"),
        pytest.param(
            {"ml101": {**ML101, "instructor": ["x"]}},
            "course 'ml101': instructor: unknown field",
            id="unknown-field",
        ),
        pytest.param({"ml101": {"instructors": ["t"]}}, "course 'ml101': group: ", id="no-group"),
        pytest.param(
            {"ml101": {**ML101, "instructors": []}},
            "course 'ml101': instructors: a non-empty list",
            id="no-instructors",
        ),
        pytest.param(
            {"ml101": {**ML101, "instructors": ["ml101"]}},
            "instructors: 'ml101' is the students' group",
            id="students-as-instructors",
        ),
        pytest.param(
            {"ml101": {**ML101, "account": "a/b"}}, "course 'ml101': account: ", id="bad-account"
        ),
        bad_field("max_reserved_gpus", 0, "a whole number of GPUs from 1 up, or null; got 0"),
        bad_field("max_reservation_hours", "4", "hours one occurrence may last, more than 0"),
        bad_field("max_days_ahead", 20000, "a whole number of days from 1 to 730; got 20000"),
        bad_field("self_grants", "yes", "true or false; got 'yes'"),
        pytest.param(
            {"ml101": ML101, "ml101b": {**ML101, "display_name": "B"}},
            "course 'ml101b': group: 'ml101' is already the group of course 'ml101'",
            id="one-group-two-courses",
        ),
    ],
)
def test_a_malformed_course_file_is_refused_naming_file_course_and_field(tmp_path, data, words):
    path = write(tmp_path, data)
    with pytest.raises(ValueError, match=r"^" + __import__("re").escape(path)) as e:
        load_courses(path)
    assert words in str(e.value)


def roles_of(c) -> dict[str, dict]:
    return {r["name"]: r for r in c.JupyterHub.load_roles}


def test_each_course_gives_its_instructors_a_role_limited_to_its_group(tmp_path, monkeypatch):
    bounded = {**ML101, "max_reserved_gpus": 1, "max_reservation_hours": 3}
    path = write(
        tmp_path, {"ml101": bounded, "ml102": {"group": "ml102", "instructors": ["ml102-staff"]}}
    )
    c = Config()
    apply_config(
        c,
        settings_from(
            tmp_path,
            monkeypatch,
            GPUHUB_COURSES=path,
            GPUHUB_OIDC_ISSUER="https://login.example.org",
            GPUHUB_OIDC_CLIENT_ID="hub",
            GPUHUB_GPUS="simulated:2",
            GPUHUB_ALLOWED_GROUPS="students",
            GPUHUB_ADMIN_GROUPS="hub-admins",
        ),
    )
    roles = roles_of(c)
    ml101 = roles["gpuhub-course-ml101"]
    assert ml101["groups"] == ["ml101-instructors"]
    assert sorted(ml101["scopes"]) == sorted(
        [
            "admin-ui",
            "list:users!group=ml101",
            "read:users!group=ml101",
            "read:servers!group=ml101",
            "delete:servers!group=ml101",
            "list:groups!group=ml101",
            "read:groups!group=ml101",
            "custom:gpuhub:gpus:read!group=ml101",
            "custom:gpuhub:reservations:admin!group=ml101",
            "custom:gpuhub:courses:grant!group=ml101",
        ]
    )
    assert all("ml102" not in s for s in ml101["scopes"])
    assert roles["gpuhub-course-ml102"]["groups"] == ["ml102-staff"]
    # instructors may log in; the site's own groups stay
    assert c.CreditAuthenticator.allowed_groups == {"students", "ml101-instructors", "ml102-staff"}
    assert "custom:gpuhub:courses:grant" in c.JupyterHub.custom_scopes
    # the grant endpoint knows the accounts, and has the managed service's admin token
    assert c.CourseGrants.courses["ml101"]["account"] == "course-ml101"
    assert c.CourseGrants.courses["ml101"]["self_grants"] is False
    # the reservations' endpoints know what each course's instructors may reserve
    assert c.ReservationBounds.courses == {
        "ml101": {
            "label": "ML101",
            "max_reserved_gpus": 1,
            "max_reservation_hours": 3.0,
            "max_days_ahead": 120,
        },
        "ml102": {
            "label": "ml102",
            "max_reserved_gpus": None,
            "max_reservation_hours": 8.0,
            "max_days_ahead": 120,
        },
    }
    assert c.CourseGrants.admin_token == (tmp_path / "credits-admin-token").read_text().strip()
    # the admins' role is unchanged
    assert "gpuhub-gpu-admins" in roles and roles["gpuhub-gpu-admins"]["groups"] == ["hub-admins"]


def test_the_roles_are_valid_jupyterhub_roles(tmp_path, monkeypatch):
    """JupyterHub's own check of a role (scopes exist, filters parse), as the hub runs it
    when it loads ``load_roles``."""
    from jupyterhub import scopes

    c = Config()
    apply_config(
        c,
        settings_from(
            tmp_path,
            monkeypatch,
            GPUHUB_COURSES=write(tmp_path, {"ml101": ML101}),
            GPUHUB_OIDC_ISSUER="https://login.example.org",
            GPUHUB_OIDC_CLIENT_ID="hub",
            GPUHUB_GPUS="simulated:2",
        ),
    )
    saved = dict(scopes.scope_definitions)
    try:
        scopes.define_custom_scopes(c.JupyterHub.custom_scopes)
        scopes._check_scopes_exist(roles_of(c)["gpuhub-course-ml101"]["scopes"])
    finally:
        scopes.scope_definitions.clear()
        scopes.scope_definitions.update(saved)
