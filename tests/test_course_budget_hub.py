"""The course budget in a real hub: during its reservation's window a course's account pays
for its members' GPU servers, and the member when it cannot and they chose so.

Real parts: JupyterHub and its proxy, Docker, the OIDC provider (its groups claim makes
``ml101``), the reference credits service, two GPUs from the NVML stand-in; the hub's
clock is moved (:class:`MovableClock`).  The "gpu" profile costs 4 credits per hour (1.00
per 15-minute interval).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import MEMBERS
from tests.test_reservation_enforcement_hub import (
    PROFILES,
    last_run,
    node,
    span,
    spawn_ready,
    until,
)

pytestmark = [pytest.mark.docker, pytest.mark.hub]

START, END = 600, 4200  # the window, in seconds after the test's start


async def entries(admin, account) -> list[tuple[str, str, dict]]:
    return [
        (t.kind, str(t.amount), dict(t.metadata)) async for t in admin.iter_transactions(account)
    ][::-1]


def usage(hub, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "usage", *args],
        capture_output=True,
        text=True,
        env=hub.env,
        cwd=hub.tmp,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_course_pays_during_its_window_and_the_member_when_it_cannot(
    gpu_hub, movable_clock, ledger_admin, credits_username, tmp_path
):
    clock = movable_clock
    alice, bob = f"{credits_username}-alice", f"{credits_username}-bob"
    account = f"{credits_username}-ml101"
    courses = tmp_path / "courses.json"
    courses.write_text(
        json.dumps(
            {
                "ml101": {
                    "display_name": "ML101",
                    "group": "ml101",
                    "instructors": ["ml101-instructors"],
                    "account": account,
                }
            }
        )
    )
    hub = await gpu_hub(
        node(),
        PROFILES,
        clock.hub_config("Reservations") + "c.Reservations.check_interval = 0.2\n",
        GPUHUB_COURSES=str(courses),
    )
    as_alice = await hub.login(alice, groups=[MEMBERS, "ml101"])
    as_bob = await hub.login(bob)
    for name in (alice, bob):
        await ledger_admin.grant(name, "10.00", key=f"test-grant-{name}")
    await ledger_admin.grant(account, "1.00", key=f"test-grant-{account}")
    cli = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    at = lambda s: datetime.fromtimestamp(clock.start + s, UTC).isoformat()  # noqa: E731
    r = await hub.api(
        "POST",
        "/gpuhub/reservations",
        token=cli,
        json={"group": "ml101", "gpus": 1, "start": at(START), "end": at(END)},
    )
    assert r.status_code == 201, r.text

    # before the window: bob's card says how long a start may run, naming the course
    runs_until = (
        f"1 GPU is reserved for ML101 {span(clock.start + START, clock.start + END)}: "
        "a server started now may run until then"
    )
    page = await eventually(lambda: _page_with(as_bob, runs_until), what="bob's card")
    assert "Paid by you" in page

    clock.at(START + 1)
    ends = until(clock.start + START, clock.start + END)
    paid_by = f"Paid by ML101 during its reservation until {ends}"
    await eventually(lambda: _page_with(as_alice, paid_by), what="alice's card")
    await spawn_ready(hub, alice)
    # the course's account paid the first interval, naming alice and the course
    course_ledger = await entries(ledger_admin, account)
    assert [(k, a) for k, a, _ in course_ledger] == [("grant", "1.00"), ("debit", "1.00")]
    assert course_ledger[1][2]["member"] == alice and course_ledger[1][2]["course"] == "ml101"
    assert last_run(hub, alice).course == "ml101"

    clock.at(START + 1 + 300)  # a third of the interval used
    await hub.stop_server(alice)
    await eventually(
        lambda: _kinds(
            ledger_admin, account, [("grant", "1.00"), ("debit", "1.00"), ("refund", "0.66")]
        ),
        what="the course's refund",
    )
    assert [(k, a) for k, a, _ in await entries(ledger_admin, alice)] == [("grant", "10.00")]

    # the course's account cannot pay the next start: alice is told, and may pay herself
    r = await hub.spawn(alice, {"profile": "gpu"})
    assert r.status_code == 402, r.text
    assert (
        "ML101's account cannot pay for this server: it has 0.66 credits" in r.json()["message"]
    ), r.text
    r = await hub.spawn(alice, {"profile": "gpu", "pay": "the dean"})
    assert r.status_code == 400 and "Options include: course, self" in r.text, r.text
    r = await hub.spawn(alice, {"profile": "gpu", "pay": "self"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(alice)
    assert [(k, a) for k, a, _ in await entries(ledger_admin, alice)] == [
        ("grant", "10.00"),
        ("debit", "1.00"),
    ]
    assert last_run(hub, alice).course is None
    await hub.stop_server(alice)

    period = [
        "--since",
        time.strftime("%Y-%m-%d", time.gmtime(clock.start - 86400)),
        "--until",
        time.strftime("%Y-%m-%d", time.gmtime(clock.start + 2 * 86400)),
    ]
    assert usage(hub, *period, "--by", "course", "--csv").splitlines() == [
        "course,servers,gpu_hours,credits,line_starts,average_wait_min",
        "ml101,1,0.08,0.34,0,-",
    ]


async def _page_with(browser, text: str) -> str:
    r = await browser.get("/hub/spawn")
    assert r.status_code == 200, r.text[:300]
    return r.text if text in r.text else ""


async def _kinds(admin, account, expected) -> bool:
    return [(k, a) for k, a, _ in await entries(admin, account)] == expected
