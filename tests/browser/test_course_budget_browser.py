"""The course budget on the spawn page, in a real browser: the card says the course pays,
and a member whose course cannot pay ticks "Pay with my own credits" and starts.

Chromium (Playwright), the OIDC provider's sign-in page (its groups claim makes
``ml101``), JupyterHub and its proxy, Docker, the reference credits service, two GPUs from
the NVML stand-in; the hub's clock is moved into the window.  ``GPUHUB_DOCS_SCREENSHOTS=1``
keeps the card and the refusal as screenshots for the docs.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from playwright.async_api import expect

from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.browser.test_journey import card, log_in
from tests.fixtures.oidc import MEMBERS
from tests.test_reservation_enforcement_hub import PROFILES, node, until

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

START, END = 60, 3660


async def test_a_member_whose_course_cannot_pay_pays_herself_from_the_card(
    gpu_hub, movable_clock, ledger_admin, credits_username, tmp_path, person, screenshots
):
    clock = movable_clock
    alice, account = f"{credits_username}-alice", f"{credits_username}-ml101"
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
    await hub.login(alice, groups=[MEMBERS, "ml101"])  # makes the group
    await ledger_admin.grant(alice, "10.00", key=f"test-grant-{alice}")
    await ledger_admin.grant(account, "0.50", key=f"test-grant-{account}")  # < 1 interval
    cli = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    at = lambda s: datetime.fromtimestamp(clock.start + s, UTC).isoformat()  # noqa: E731
    r = await hub.api(
        "POST",
        "/gpuhub/reservations",
        token=cli,
        json={"group": "ml101", "gpus": 1, "start": at(START), "end": at(END)},
    )
    assert r.status_code == 201, r.text
    clock.at(START + 1)

    page = await person()
    await log_in(page, hub, alice)
    gpu = card(page, "gpu")
    ends = until(clock.start + START, clock.start + END)
    paid_by = f"Paid by ML101 during its reservation until {ends}"
    for _ in range(20):  # the window opens at the hub's next pass
        if paid_by in await gpu.inner_text():
            break
        await page.reload()
    await expect(gpu).to_contain_text(paid_by)
    await screenshots.take(page, "20-course-pays")

    await gpu.click()
    await page.get_by_role("button", name="Start").click()
    await expect(page.locator("body")).to_contain_text(
        "ML101's account cannot pay for this server: it has 0.50 credits", timeout=20_000
    )
    await screenshots.take(page, "21-course-cannot-pay")

    gpu = card(page, "gpu")
    await gpu.click()
    await gpu.get_by_role("checkbox", name=re.compile("Pay with my own credits")).check()
    await page.get_by_role("button", name="Start").click()
    await hub.wait_ready(alice)
    ledger = [(t.kind, str(t.amount)) async for t in ledger_admin.iter_transactions(alice)]
    assert ledger[::-1] == [("grant", "10.00"), ("debit", "1.00")]
    course = [(t.kind, str(t.amount)) async for t in ledger_admin.iter_transactions(account)]
    assert course == [("grant", "0.50")]
