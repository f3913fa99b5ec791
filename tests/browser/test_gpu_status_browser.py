"""A member sees her GPU in JupyterLab's status bar, in a real browser.

alice signs in at the OIDC provider, starts the GPU profile on the demo's simulated GPUs
(their figures from a JSON file the simulated inventory reads again at every read) and
lands in JupyterLab: the status bar shows her GPU's utilisation and memory, says they are
simulated, and follows them when they change.  Real parts: Chromium (Playwright), the OIDC
provider, JupyterHub and its proxy, a Docker container of the notebook image
(``GPUHUB_TEST_IMAGE``, default gpuhub/base, whose ``gpuhub_lab`` extension is under test),
the hub's ``gpus/mine`` read with the server's own token.
"""

from __future__ import annotations

import json

import pytest
from playwright.async_api import expect

from tests.browser.test_journey import log_in, start_profile
from tests.fixtures.hub import NOTEBOOK_IMAGE

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {
        "display_name": "One GPU",
        "slug": "gpu",
        "gpus": 1,
        "spawner_override": {"image": NOTEBOOK_IMAGE},
    },
]


def node(utilization: int, used_mib: int) -> dict:
    """The simulated node: one GPU with these figures."""
    return {
        "devices": [
            {
                "uuid": "GPU-5a1e0000-0000-4000-8000-000000000000",
                "name": "Simulated A100",
                "memory_total_mib": 40960,
                "memory_used_mib": used_mib,
                "utilization_gpu": utilization,
            }
        ]
    }


async def test_her_gpus_figures_show_in_the_status_bar_and_follow_the_gpu(
    hub_factory, tmp_path, oidc_provider, person, screenshots
):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps(node(37, 2048)))
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(PROFILES))
    hub = await hub_factory(
        GPUHUB_PROFILES=str(profiles), GPUHUB_GPUS=f"simulated:{gpus}", GPUHUB_CREDITS="off"
    )
    oidc_provider.member("alice")
    page = await person()
    await log_in(page, hub, "alice")
    await start_profile(page, "gpu")
    await page.wait_for_url("**/user/alice/lab**", timeout=90_000)

    item = page.locator("#gpuhub-gpu-status")
    await expect(item).to_have_text("GPU 37% · 2.0 / 40.0 GiB (simulated)", timeout=60_000)
    await expect(page.locator(".jp-Launcher")).to_be_visible()
    await screenshots.take(page, "40-gpu-status", full_page=False)

    gpus.write_text(json.dumps(node(92, 30720)))  # her training starts
    await expect(item).to_have_text("GPU 92% · 30.0 / 40.0 GiB (simulated)", timeout=30_000)
