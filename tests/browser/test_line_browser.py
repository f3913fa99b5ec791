"""Waiting in line for a GPU, in a real browser.

Chromium (Playwright), the OIDC provider's sign-in page, JupyterHub and its proxy, Docker
containers on one simulated GPU.  ``GPUHUB_DOCS_SCREENSHOTS=1`` refreshes the README's
screenshot of the waiting page (``docs/screenshots/10-line-waiting.png``).
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from playwright.async_api import expect

from tests.browser.test_journey import card, log_in
from tests.fixtures.hub import eventually

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {
        "display_name": "PyTorch",
        "slug": "pytorch",
        "gpus": 1,
        "description": "PyTorch on one exclusive GPU.",
    },
]


async def test_member_waits_on_the_progress_page_and_lands_in_jupyterlab(
    hub_factory, tmp_path, oidc_provider, person, screenshots
):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(PROFILES))
    hub = await hub_factory(
        extra_config="c.Line.update_interval = 0.5\n",
        GPUHUB_PROFILES=str(profiles),
        GPUHUB_GPUS="simulated:1",
        GPUHUB_CREDITS="off",
    )
    await hub.create_user("alice")
    bob_token = await hub.create_user("bob")
    r = await hub.spawn("alice", {"profile": "pytorch"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    bob_asks = asyncio.create_task(hub.spawn("bob", {"profile": "pytorch", "wait": True}))

    async def bob_waits():
        r = await hub.api("GET", "/gpuhub/line", token=bob_token)
        return r.json()["places"]

    await eventually(bob_waits, what="bob in line")

    # carol finds no GPU free, and chooses to wait
    oidc_provider.member("carol")
    carol = await person()
    await log_in(carol, hub, "carol")
    pytorch = card(carol, "pytorch")
    await expect(pytorch).to_contain_text("No GPU free: all 1 GPUs are in use")
    await pytorch.get_by_role("button", name="Wait for a GPU").click()
    await carol.wait_for_url(re.compile("/hub/spawn-pending/carol"))
    message = carol.locator("#progress-message")
    await expect(message).to_contain_text(
        re.compile(r"You are 2nd in line for 1 GPU \(PyTorch\)\. Estimated wait: ")
    )
    await screenshots.take(carol, "10-line-waiting")

    # alice stops: bob's turn; carol's page moves her up without a reload
    await hub.stop_server("alice")
    await hub.wait_ready("bob")
    await expect(message).to_contain_text(
        "You are 1st in line for 1 GPU (PyTorch).", timeout=15_000
    )
    await screenshots.take(carol, "11-line-first")

    # bob stops: carol's turn; she lands in JupyterLab
    await hub.stop_server("bob")
    await carol.wait_for_url(re.compile("/user/carol/lab"), timeout=90_000)
    await expect(carol.locator(".jp-Launcher")).to_be_visible(timeout=60_000)
    await screenshots.take(carol, "12-line-lab")
    await bob_asks
