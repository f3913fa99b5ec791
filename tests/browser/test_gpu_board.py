"""The GPU board in a real browser: an admin watches a member's GPU and stops the server.

Everything is real: Chromium (Playwright), JupyterHub and its proxy, the OIDC provider, the
reference credits service, Docker, and the GPUs read through pynvml from the NVML stand-in,
whose utilization the test rewrites while the page is open.  The credits hook runs on a
clock the test moves.  A screenshot of the board goes to ``artifacts/browser/<test>/``.
"""

from __future__ import annotations

import httpx
import pytest

from tests.fixtures.hub import eventually
from tests.fixtures.oidc import ADMINS

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

GPU = "GPU-11111111-2222-3333-4444-000000000000"
# 4 credits per hour: the first 15-minute interval costs 1.00
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
]


def node(utilization: int) -> dict:
    return {
        "devices": [
            {
                "uuid": GPU,
                "name": "Stand-in",
                "memory_total_mib": 16384,
                "memory_used_mib": 1024,
                "utilization_gpu": utilization,
            }
        ]
    }


async def signed_in(page, client: httpx.AsyncClient) -> None:
    """Give ``page``'s browser context the hub cookies of ``client``, who logged in through
    the provider (:meth:`tests.fixtures.hub.Hub.login`)."""
    await page.context.add_cookies(
        [
            {
                "name": c.name,
                "value": c.value,
                "domain": c.domain.lstrip("."),
                "path": c.path or "/",
                "httpOnly": c.has_nonstandard_attr("HttpOnly"),
                "secure": bool(c.secure),
            }
            for c in client.cookies.jar
        ]
    )


async def test_admin_page_shows_the_holder_live_and_stops_with_a_refund(
    gpu_hub, movable_clock, ledger_admin, credits_username, person, screenshots, nvml_node
):
    hub = await gpu_hub(node(utilization=37), PROFILES)
    member = credits_username
    boss = await hub.login("boss", groups=[ADMINS])
    await hub.login(member)
    await ledger_admin.grant(member, "10.00", key=f"test-grant-{member}")
    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(member)

    page = await person()
    await signed_in(page, boss)
    await page.goto(f"{hub.url}/hub/gpus")
    row = page.locator(f'tr[data-uuid="{GPU}"]')
    assert await row.locator(".gpuhub-owner").inner_text() == member
    assert await row.locator(".gpuhub-profile").inner_text() == "gpu"
    assert await row.locator(".gpuhub-util").inner_text() == "37%"
    assert await row.locator(".gpuhub-state").inner_text() == "held"

    # the page follows the GPU without a reload (a reload would drop the marker)
    await page.evaluate("window.gpuhubMarker = 42")
    nvml_node.write(node(utilization=64))
    await row.locator(".gpuhub-util", has_text="64%").wait_for(timeout=15_000)
    assert await page.evaluate("window.gpuhubMarker") == 42
    await screenshots.take(page, "01-gpu-board")

    movable_clock.at(300)  # a third of the first 15-minute interval used
    page.once("dialog", lambda dialog: dialog.accept())
    await row.locator("button.gpuhub-stop").click()
    await row.locator(".gpuhub-state", has_text="free").wait_for(timeout=30_000)
    assert await row.locator(".gpuhub-owner").inner_text() == ""
    assert await hub.stopped(member)
    assert (await hub.api("GET", "/gpuhub/availability")).json()["free"] == 1

    async def refunded():
        entries = [(t.kind, str(t.amount)) async for t in ledger_admin.iter_transactions(member)]
        return entries[::-1] == [("grant", "10.00"), ("debit", "1.00"), ("refund", "0.66")]

    await eventually(refunded, what="the pro rata refund")
