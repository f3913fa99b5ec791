"""Issue 24's journey in a real browser: a reservation of 1 of 2 GPUs for ML101; bob (not
in ML101) is warned and stopped at its start; alice (ML101) starts and the course pays;
carol (ML101's instructor, not an admin) sees alice's server on her board and stops it;
at the window's end the GPU goes to the head of the line (eve).

Chromium (Playwright), JupyterHub and its proxy, Docker, the OIDC provider with the
groups, the reference credits service, two GPUs from the NVML stand-in; the hub's clock
is moved (:class:`MovableClock`).  ``GPUHUB_DOCS_SCREENSHOTS=1`` keeps the steps.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from playwright.async_api import expect

from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.browser.test_gpu_board import signed_in
from tests.browser.test_journey import card
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import MEMBERS
from tests.test_reservation_enforcement_hub import PROFILES, node, span, spawn_ready, until

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

START, END = 3600, 7200


async def test_a_course_session_from_the_warning_to_the_line(
    gpu_hub, movable_clock, ledger_admin, credits_username, tmp_path, person, screenshots
):
    clock = movable_clock
    names = {n: f"{credits_username}-{n}" for n in ("dan", "bob", "eve", "alice", "carol")}
    dan, bob, eve, alice, carol = names.values()
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
        clock.hub_config("Reservations")
        + "c.Reservations.check_interval = 0.2\nc.Line.update_interval = 30\n",
        GPUHUB_COURSES=str(courses),
    )
    clients = {n: await hub.login(n) for n in (dan, bob, eve)}
    clients[alice] = await hub.login(alice, groups=[MEMBERS, "ml101"])
    clients[carol] = await hub.login(carol, groups=["ml101-instructors"])
    for name in (dan, bob, eve, alice):
        await ledger_admin.grant(name, "10.00", key=f"test-grant-{name}")
    await ledger_admin.grant(account, "5.00", key=f"test-grant-{account}")
    await spawn_ready(hub, dan)
    await spawn_ready(hub, bob)  # the most recently started: the one to make way
    cli = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    at = lambda s: datetime.fromtimestamp(clock.start + s, UTC).isoformat()  # noqa: E731
    r = await hub.api(
        "POST",
        "/gpuhub/reservations",
        token=cli,
        json={"group": "ml101", "gpus": 1, "start": at(START), "end": at(END)},
    )
    assert r.status_code == 201, r.text
    window = f"1 GPU is reserved for ML101 {span(clock.start + START, clock.start + END)}"

    # bob is warned on his home page, and stopped at the start
    page = await person()
    await signed_in(page, clients[bob])
    clock.at(START - 900)  # the warning time before the start
    warning = f"will be stopped in about 15 min: {window}"
    for _ in range(40):
        await page.goto(f"{hub.url}/hub/home")
        if warning in await page.locator("body").inner_text():
            break
        await asyncio.sleep(0.5)
    await expect(page.locator("body")).to_contain_text(warning)
    await screenshots.take(page, "22-course-warned")
    clock.at(START + 1)
    await eventually(lambda: hub.stopped(bob), what="bob's server stopped")
    assert await hub.running(dan)
    await page.goto(f"{hub.url}/hub/home")
    await expect(page.locator("body")).to_contain_text(f"Your server was stopped: {window}")

    # eve, not in ML101, waits in line for the reserved GPU
    waiting = asyncio.create_task(hub.spawn(eve, {"profile": "gpu", "wait": True}))
    try:

        async def eve_in_line():
            r = await hub.browser_api(clients[eve], "GET", "/gpuhub/line")
            return bool(r.json()["places"])

        await eventually(eve_in_line, what="eve in line")

        # alice starts from her card, which says the course pays; the course's account does
        page = await person()
        await signed_in(page, clients[alice])
        await page.goto(f"{hub.url}/hub/spawn")
        gpu = card(page, "gpu")
        await expect(gpu).to_contain_text(
            "Paid by ML101 during its reservation until "
            + until(clock.start + START, clock.start + END)
        )
        await screenshots.take(page, "23-course-card")
        await gpu.click()
        await page.get_by_role("button", name="Start").click()
        await hub.wait_ready(alice)
        debits = [t async for t in ledger_admin.iter_transactions(account) if t.kind == "debit"]
        assert [(t.amount, t.metadata["member"], t.metadata["course"]) for t in debits] == [
            (debits[0].amount, alice, "ml101")
        ]
        assert [t.kind async for t in ledger_admin.iter_transactions(alice)] == ["grant"]

        # carol sees alice's server on her board and stops it; the course gets the refund
        page = await person()
        await signed_in(page, clients[carol])
        await page.goto(f"{hub.url}/hub/home")
        await page.get_by_role("link", name="GPUs").click()
        row = page.locator("table.gpuhub-board tbody tr").filter(has_text=alice)
        await row.wait_for(timeout=15_000)
        await screenshots.take(page, "24-course-board")
        page.once("dialog", lambda dialog: dialog.accept())
        await row.locator("button.gpuhub-stop").click()
        await eventually(lambda: hub.stopped(alice), 60, "alice's server stopped")
        await eventually(
            lambda: _kinds(ledger_admin, account, ["grant", "debit", "refund"]),
            what="the course's refund",
        )
        assert await eve_in_line()  # the GPU stays the course's until the window ends

        # the window ends: the GPU goes to the head of the line at once
        clock.at(END + 1)
        await hub.wait_ready(eve)
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def _kinds(admin, account, expected) -> bool:
    return [t.kind async for t in admin.iter_transactions(account)][::-1] == expected
