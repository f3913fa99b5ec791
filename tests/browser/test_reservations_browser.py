"""The reservations page in a real browser: an admin reserves GPUs for a course through its
form, is told why a second reservation does not fit, and deletes the first; a course's
instructor reads what her course may reserve and is held to it.

Real Chromium (Playwright), JupyterHub and its proxy, the OIDC provider; two simulated GPUs.
A screenshot of the page goes to ``artifacts/browser/<test>/``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from playwright.async_api import expect

from tests.browser.test_gpu_board import signed_in
from tests.fixtures.oidc import ADMINS, MEMBERS

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]


async def test_an_admin_reserves_gpus_for_a_course_on_the_page_and_deletes_them(
    hub_factory, person, screenshots
):
    hub = await hub_factory(GPUHUB_CREDITS="off")
    for group in ("ml101", "ml102"):
        assert (await hub.api("POST", f"/groups/{group}")).status_code == 201
    boss = await hub.login("boss", groups=[ADMINS])
    day = (datetime.now(UTC) + timedelta(days=3)).strftime("%Y-%m-%d")

    page = await person()
    await signed_in(page, boss)
    await page.goto(f"{hub.url}/hub/home")
    await page.get_by_role("link", name="Reservations").click()
    form = page.locator("form.gpuhub-reservation-form")

    async def reserve(group: str, gpus: int, rule: str, note: str) -> None:
        await form.get_by_label("Group", exact=True).select_option(group)
        await form.get_by_label("GPUs", exact=True).fill(str(gpus))
        await form.get_by_label("Time zone").fill("UTC")
        await form.get_by_label("Start", exact=True).fill(f"{day}T14:00")
        await form.get_by_label("End", exact=True).fill(f"{day}T16:00")
        await form.get_by_label("Repeat").fill(rule)
        await form.get_by_label("Note").fill(note)
        await form.get_by_role("button", name="Reserve").click()

    await reserve("ml101", 2, "FREQ=WEEKLY;COUNT=10", "ML101 lab")
    row = page.locator("table.gpuhub-reservations tbody tr", has_text="ML101 lab")
    await row.wait_for(timeout=15_000)
    await page.wait_for_load_state()  # the page reloaded after the reservation was made
    assert await row.locator(".gpuhub-next").inner_text() == (
        f"{day}T14:00:00+00:00 to {day}T16:00:00+00:00"
    )
    [made] = (await hub.browser_api(boss, "GET", "/gpuhub/reservations")).json()["reservations"]

    # a second course at the same hour does not fit: the page says why, nothing is kept
    await reserve("ml102", 1, "", "ML102 lab")
    status = page.locator(".gpuhub-reservations-status")
    await status.get_by_text("Not enough GPUs at").wait_for(timeout=15_000)
    assert f"reservation {made['id']} (ml101, 2 GPUs" in await status.inner_text()
    await screenshots.take(page, "01-reservations")
    assert [
        r["id"]
        for r in (await hub.browser_api(boss, "GET", "/gpuhub/reservations")).json()["reservations"]
    ] == [made["id"]]

    page.once("dialog", lambda dialog: dialog.accept())
    await row.get_by_role("button", name="Delete").click()
    await row.wait_for(state="detached", timeout=15_000)
    assert (await hub.browser_api(boss, "GET", "/gpuhub/reservations")).json() == {
        "reservations": []
    }


async def test_an_instructor_reads_her_courses_bounds_and_reserves_within_them(
    hub_factory, person, screenshots, tmp_path
):
    """Issue 28: carol teaches ML101 (not an admin).  The page tells her what ML101 may
    reserve; both GPUs are refused in words, one is kept."""
    courses = tmp_path / "courses.json"
    courses.write_text(
        json.dumps(
            {
                "ml101": {
                    "display_name": "ML101",
                    "group": "ml101",
                    "instructors": ["ml101-instructors"],
                    "max_reservation_hours": 4,
                }
            }
        )
    )
    hub = await hub_factory(GPUHUB_CREDITS="off", GPUHUB_COURSES=str(courses))
    await hub.login("alice", groups=[MEMBERS, "ml101"])  # makes the group
    carol = await hub.login("carol", groups=["ml101-instructors"])
    day = (datetime.now(UTC) + timedelta(days=3)).strftime("%Y-%m-%d")

    page = await person()
    await signed_in(page, carol)
    await page.goto(f"{hub.url}/hub/home")
    await page.get_by_role("link", name="Reservations").click()
    await expect(page.locator(".gpuhub-reservation-bounds")).to_have_text(
        "ML101 may reserve up to 1 GPU at once, 4 hours per occurrence, up to 120 days ahead, "
        "starting at least 15 min from now. An admin may reserve more."
    )
    form = page.locator("form.gpuhub-reservation-form")
    await form.get_by_label("Group", exact=True).select_option("ml101")
    await form.get_by_label("Time zone").fill("UTC")
    await form.get_by_label("Start", exact=True).fill(f"{day}T14:00")
    await form.get_by_label("End", exact=True).fill(f"{day}T16:00")
    await form.get_by_label("GPUs", exact=True).fill("2")
    await form.get_by_role("button", name="Reserve").click()
    status = page.locator(".gpuhub-reservations-status")
    await expect(status).to_have_text(
        "ML101 may reserve at most 1 GPU at once, half of the hub's 2; this reservation asks "
        "for 2. Ask an admin (GPUHUB_COURSES field max_reserved_gpus).",
        timeout=15_000,
    )
    await screenshots.take(page, "02-instructor-bounds")
    await form.get_by_label("GPUs", exact=True).fill("1")
    await form.get_by_role("button", name="Reserve").click()
    row = page.locator("table.gpuhub-reservations tbody tr", has_text="ml101")
    await row.wait_for(timeout=15_000)
    [made] = (await hub.browser_api(carol, "GET", "/gpuhub/reservations")).json()["reservations"]
    assert (made["gpus"], made["created_by"]) == (1, "carol")
