"""A course's instructor in a real browser: carol (ML101, not an admin) opens the GPU board
from the navigation bar, sees her student's GPU with a Stop button and another course's GPU
as held by nobody named, stops her student's server, may reserve for her course only, and
finds her course on JupyterHub's admin page.

Real Chromium (Playwright), JupyterHub and its proxy, the OIDC provider with the groups,
real Docker servers on two simulated GPUs.  Screenshots go to ``artifacts/browser/<test>/``.
"""

from __future__ import annotations

import json

import pytest

from tests.browser.test_gpu_board import signed_in
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import MEMBERS

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]


async def test_an_instructor_sees_her_course_on_the_board_and_stops_a_students_server(
    hub_factory, person, screenshots, tmp_path
):
    courses = tmp_path / "courses.json"
    courses.write_text(
        json.dumps(
            {
                "ml101": {
                    "display_name": "ML101",
                    "group": "ml101",
                    "instructors": ["ml101-instructors"],
                },
                "ml102": {
                    "display_name": "ML102",
                    "group": "ml102",
                    "instructors": ["ml102-instructors"],
                },
            }
        )
    )
    hub = await hub_factory(GPUHUB_CREDITS="off", GPUHUB_COURSES=str(courses))
    await hub.login("alice", groups=[MEMBERS, "ml101"])
    await hub.login("bob", groups=[MEMBERS, "ml102"])
    carol = await hub.login("carol", groups=["ml101-instructors"])
    for name in ("alice", "bob"):
        r = await hub.spawn(name, {"profile": "pytorch"})
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready(name)

    page = await person()
    await signed_in(page, carol)
    await page.goto(f"{hub.url}/hub/home")
    await page.get_by_role("link", name="GPUs").click()
    rows = page.locator("table.gpuhub-board tbody tr")
    await rows.first.wait_for(timeout=15_000)
    assert await rows.count() == 2
    alice_row = rows.filter(has_text="alice")
    other_row = rows.filter(has_not_text="alice")
    assert await other_row.locator(".gpuhub-state").inner_text() == "held"
    assert await other_row.locator(".gpuhub-owner").inner_text() == ""
    assert await other_row.locator("button.gpuhub-stop").count() == 0
    assert "bob" not in await page.content()
    await screenshots.take(page, "01-instructor-board")

    page.once("dialog", lambda dialog: dialog.accept())
    await alice_row.locator("button.gpuhub-stop").click()
    await eventually(lambda: hub.stopped("alice"), 60, "alice's server stopped")
    assert await hub.running("bob")

    # her reservations page offers her course's group only
    await page.get_by_role("link", name="Reservations").click()
    group = page.locator("form.gpuhub-reservation-form").get_by_label("Group", exact=True)
    assert await group.locator("option").all_inner_texts() == ["ml101"]

    await page.goto(f"{hub.url}/hub/admin")
    await page.get_by_text("alice").first.wait_for(timeout=15_000)
    await screenshots.take(page, "02-instructor-admin-page")
    assert "bob" not in await page.locator("body").inner_text()
