"""A course's instructor in a real hub: carol teaches ML101 and is not an admin.

Real JupyterHub and proxy with the project's configuration, real Docker servers on two
simulated GPUs, the OIDC provider with the groups (alice in ``ml101``, bob in ``ml102``,
carol in ``ml101-instructors`` only), the reference Credits API with the course accounts
(behind :class:`LedgerFaults`, which loses one answer).
One hub for every check: carol logs in, lists ML101, sees alice's server on her board
(bob's GPU as held, nobody named), stops alice's server, reserves GPUs for ML101, grants
course credits to alice (once, though an answer was lost and she sent it again); every
request she forges against ML102 is refused.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.fixtures.credits_faults import LedgerFaults
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import MEMBERS

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def day(days: int, hour: int) -> str:
    """ISO text of ``hour``:00 UTC, ``days`` from today."""
    when = datetime.now(UTC) + timedelta(days=days)
    return when.replace(hour=hour, minute=0, second=0, microsecond=0).isoformat()


@pytest.fixture
def faults(credits_service):
    double = LedgerFaults(credits_service.url)
    yield double
    double.close()


@pytest.fixture
async def admin_ledger(credits_service):
    async with credits_service.client(admin=True) as client:
        yield client


async def test_an_instructor_runs_her_course_and_nothing_else(
    hub_factory, credits_service, admin_ledger, faults, tmp_path
):
    tag = uuid.uuid4().hex[:6]
    alice, bob, carol, ivan = (f"{n}-{tag}" for n in ("alice", "bob", "carol", "ivan"))
    ml101_account, ml102_account = f"course-ml101-{tag}", f"course-ml102-{tag}"
    courses = tmp_path / "courses.json"
    courses.write_text(
        json.dumps(
            {
                "ml101": {
                    "display_name": "ML101",
                    "group": "ml101",
                    "instructors": ["ml101-instructors"],
                    "account": ml101_account,
                    "max_reserved_gpus": 1,
                    "max_reservation_hours": 3,
                    "max_days_ahead": 60,
                },
                "ml102": {
                    "display_name": "ML102",
                    "group": "ml102",
                    "instructors": ["ml102-instructors"],
                    "account": ml102_account,
                },
            }
        )
    )
    for account in (ml101_account, ml102_account):
        await admin_ledger.grant(account, "20.00", key=f"test-{account}")
    await admin_ledger.grant(bob, "10.00", key=f"test-{bob}")
    hub = await hub_factory(
        extra_config="c.CreditsClient.timeout = 1\nc.CreditsClient.max_attempts = 2\n",
        GPUHUB_COURSES=str(courses),
        GPUHUB_CREDITS_URL=faults.url,
        GPUHUB_CREDITS_TOKEN=credits_service.hub_token,
        GPUHUB_CREDITS_ADMIN_TOKEN=credits_service.admin_token,
    )
    alice_web = await hub.login(alice, groups=[MEMBERS, "ml101"])
    bob_web = await hub.login(bob, groups=[MEMBERS, "ml102"])
    # an instructor's group may log in although it is none of GPUHUB_ALLOWED_GROUPS
    carol_web = await hub.login(carol, groups=["ml101-instructors"])
    assert not await hub.is_admin(carol)
    # ivan teaches ML101 and takes it too
    ivan_web = await hub.login(ivan, groups=["ml101-instructors", "ml101"])

    async def as_carol(method, path, **kw):
        return await hub.browser_api(carol_web, method, path, **kw)

    # -- course credits: from the course account to alice, once per request id ------------
    grant = {"user": alice, "amount": "5", "reason": "lab 1", "request_id": f"lab1-{tag}"}
    r = await as_carol("POST", "/gpuhub/courses/ml101/grants", json=grant)
    assert r.status_code == 201, r.text
    assert r.json()["course_balance"] == "15.00" and not r.json()["replayed"]
    r = await as_carol("POST", "/gpuhub/courses/ml101/grants", json=grant)  # a retry
    assert r.status_code == 201 and r.json()["replayed"], r.text
    assert (await admin_ledger.balance(alice)).balance == Decimal("5.00")
    assert (await admin_ledger.balance(ml101_account)).balance == Decimal("15.00")
    # the Credits API takes the debit but its answer is lost: 503, then the same request
    # again moves the credits once
    lost = {"user": alice, "amount": "2", "request_id": f"lab2-{tag}"}
    faults.set("answer_lost")
    r = await as_carol("POST", "/gpuhub/courses/ml101/grants", json=lost)
    assert r.status_code == 503 and f"request_id 'lab2-{tag}'" in r.json()["message"], r.text
    faults.set("forward")
    assert (await admin_ledger.balance(ml101_account)).balance == Decimal("13.00")
    r = await as_carol("POST", "/gpuhub/courses/ml101/grants", json=lost)
    assert r.status_code == 201, r.text
    assert (await admin_ledger.balance(ml101_account)).balance == Decimal("13.00")
    assert (await admin_ledger.balance(alice)).balance == Decimal("7.00")
    r = await as_carol(
        "POST", "/gpuhub/courses/ml101/grants", json={"user": alice, "amount": "100"}
    )
    assert r.status_code == 402, r.text
    assert "ML101's account has 13.00 credits; it cannot pay 100.00" in r.json()["message"]
    # nobody grants a course's credits to themselves (issue 28); ivan may grant to alice
    r = await hub.browser_api(
        ivan_web, "POST", "/gpuhub/courses/ml101/grants", json={"user": ivan, "amount": "5"}
    )
    assert r.status_code == 403, r.text
    assert r.json()["message"] == (
        "You may not grant ML101's credits to yourself: another instructor or an admin may. "
        "(A course allows it with self_grants in GPUHUB_COURSES.)"
    )
    assert (await admin_ledger.balance(ml101_account)).balance == Decimal("13.00")
    forged = await as_carol("POST", "/gpuhub/courses/ml101/grants", content=b"[" * 4000)
    assert forged.status_code == 400 and "JSON object" in forged.json()["message"], forged.text
    assert "RecursionError" not in hub.log()

    # -- both members start a GPU server: one GPU each ------------------------------------
    for name, web in ((alice, alice_web), (bob, bob_web)):
        r = await hub.browser_api(web, "POST", f"/users/{name}/server", json={"profile": "pytorch"})
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready(name)

    # -- carol lists her course: alice and her server, not bob -------------------------------
    r = await as_carol("GET", "/users")
    assert r.status_code == 200, r.text
    users = {u["name"]: u for u in r.json()}
    assert alice in users and bob not in users
    assert users[alice]["servers"][""]["ready"]
    r = await as_carol("GET", "/groups/ml101")
    assert r.status_code == 200 and alice in r.json()["users"], r.text

    # -- her board: alice's GPU with a Stop, bob's as held by nobody named -----------------
    r = await as_carol("GET", "/gpuhub/gpus")
    assert r.status_code == 200, r.text
    rows = r.json()["devices"]
    assert sorted(d["state"] for d in rows) == ["held", "held"], rows
    mine = [d for d in rows if d["owner"]]
    assert len(mine) == 1 and mine[0]["owner"]["user"] == alice, rows
    assert mine[0]["owner"]["stop_url"].endswith(f"/users/{alice}/server")
    page = await carol_web.get("/hub/gpus")
    assert page.status_code == 200 and alice in page.text and bob not in page.text

    # -- forged requests against ML102: its member, server, reservation, grant ---------
    forged = [
        ("GET", f"/users/{bob}", None),
        ("GET", "/groups/ml102", None),
        ("DELETE", f"/users/{bob}/server", None),
        (
            "POST",
            "/gpuhub/reservations",
            {
                "group": "ml102",
                "gpus": 1,
                "start": "2030-01-08T14:00:00+00:00",
                "end": "2030-01-08T16:00:00+00:00",
            },
        ),
        ("POST", "/gpuhub/courses/ml102/grants", {"user": bob, "amount": "1"}),
        ("POST", "/gpuhub/courses/ml101/grants", {"user": bob, "amount": "1"}),
        ("POST", f"/users/{bob}/tokens", {}),
        ("PATCH", f"/users/{alice}", {"admin": True}),
    ]
    for method, path, body in forged:
        r = await as_carol(method, path, **({"json": body} if body is not None else {}))
        assert r.status_code in (403, 404), (method, path, r.status_code, r.text)
    assert await hub.running(bob)
    assert (await admin_ledger.balance(ml102_account)).balance == Decimal("20.00")
    assert (await admin_ledger.balance(bob)).balance <= Decimal("10.00")
    assert not await hub.is_admin(alice)

    # -- a reservation for her course, within its bounds ------------------------------------
    lab = {"group": "ml101", "gpus": 1, "start": day(7, 14), "end": day(7, 16), "note": "ML101 lab"}
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    beyond = [
        ({"gpus": 2}, "ML101 may reserve at most 1 GPU at once; this reservation asks for 2."),
        ({"end": day(7, 18)}, "ML101's reservations last at most 3 hours per occurrence"),
        (
            {"start": day(70, 14), "end": day(70, 16)},
            "ML101's reservations reach at most 60 days ahead",
        ),
        (
            {"rrule": "FREQ=WEEKLY;INTERVAL=3;COUNT=1000"},
            "ML101's reservations reach at most 60 days ahead",
        ),
        (
            {"start": soon.isoformat(), "end": (soon + timedelta(hours=1)).isoformat()},
            "starts at least 15 min from now",
        ),
    ]
    for change, words in beyond:
        r = await as_carol("POST", "/gpuhub/reservations", json={**lab, **change})
        assert r.status_code == 403 and words in r.json()["message"], (change, r.text)
    r = await as_carol("POST", "/gpuhub/reservations", json=lab)
    assert r.status_code == 201, r.text
    # her page says what ML101 may reserve
    page = await carol_web.get("/hub/reservations")
    assert page.status_code == 200
    assert "ML101 may reserve up to 1 GPU at once, 3 hours per occurrence, up to 60 days " in (
        page.text
    )

    # -- she stops alice's server, as the board's Stop does ---------------------------------
    r = await as_carol("DELETE", f"/users/{alice}/server")
    assert r.status_code in (202, 204), r.text
    await eventually(lambda: hub.stopped(alice), 60, f"{alice}'s server stopped")
    assert await hub.running(bob)

    # -- JupyterHub's admin page opens for her; its user list is her course ------------------
    page = await carol_web.get("/hub/admin")
    assert page.status_code == 200, page.status_code
