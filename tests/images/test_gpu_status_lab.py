"""JupyterLab's status bar in the image shows the GPUs of the server and its GPU kernels, a
GPU kernel's place in line, and why the hub ended one (``gpuhub_lab``, images/README.md
"JupyterLab").

A contract test of the image's extension, not of the hub: the image's real
jupyterhub-singleuser, with ``gpuhub_lab`` as built, talks to :class:`GPUStatusHub`, a small
real HTTP server started here that answers the hub's documented endpoints
(``/hub/api/gpuhub/gpus/mine``, ``/hub/api/gpuhub/kernels``: docs/reference/rest-api.md,
the kernels' design) with what the test sets and records every request; Chromium
(Playwright) loads JupyterLab from that server.  The hub's own ``gpus/mine`` is tested with a
real hub in ``tests/test_my_gpus_hub.py`` and, in a browser, in
``tests/browser/test_gpu_status_browser.py``.
"""

from __future__ import annotations

import os
import re
import time

import httpx
import pytest

from tests.images.conftest import HubThatKnowsOnlyAlice

pytestmark = pytest.mark.docker

SERVER_TOKEN = "server-api-token"  # what alice_server gives its server as JUPYTERHUB_API_TOKEN
HER_GPU = {
    "uuid": "GPU-00000000-0000-4000-8000-000000000000",
    "name": "Simulated GPU (no driver)",
    "held_by": "",
    "utilization_pct": 37,
    "memory_used_mib": 2048,
    "memory_total_mib": 40960,
    "simulated": True,
}
KERNELS_GPU = {
    **HER_GPU,
    "uuid": "GPU-00000000-0000-4000-8000-000000000001",
    "held_by": "kernel-0123456789ab",
    "utilization_pct": 81,
    "memory_used_mib": 30720,
}
#: milliseconds a change at the hub may take to reach the status bar: JupyterLab reads every
#: 5 s, the server reuses the hub's answer for 2 s, and this machine may be loaded
WAIT = 30_000
IDLE = "The GPU kernel was shut down after 15 min without running a cell; its GPU went back."


def kernel(kernel_id: str, state: str, **more) -> dict:
    """A GPU kernel as the hub's ``kernels/<id>`` answers it."""
    return {
        "id": kernel_id,
        "profile": "pytorch",
        "notebook": "projects/train.ipynb",
        "parent": "",
        "state": state,
        "place": None,
        "started": None,
        "ended": None,
        "server_url": f"/user/alice/kernel-{kernel_id}/",
        "gpus": [],
        **more,
    }


def place(position: int, message: str) -> dict:
    return {"position": position, "estimate_s": 300.0, "message": message}


class GPUStatusHub(HubThatKnowsOnlyAlice):
    """The hub's REST API as far as a member's server uses it: conftest's stand-in (version,
    alice's token), and ``gpus/mine`` and ``kernels`` for the server's own token (403 for
    any other), answering :attr:`gpus` and :attr:`kernels` (or :attr:`kernels_status`,
    such as 404 from a hub without GPU kernels); :attr:`reads` records those requests."""

    def __init__(self, version):
        self.reads: list[tuple[str, str | None]] = []  # (path, Authorization header)
        self.gpus = [HER_GPU]
        self.kernels: list[dict] = []
        self.kernels_status = 200
        super().__init__(version)

    def route(self, path, auth):
        if not path.startswith("/hub/api/gpuhub/"):
            return super().route(path, auth)
        self.reads.append((path, auth))
        if auth != f"token {SERVER_TOKEN}":
            return 403, {"status": 403, "message": "not alice's server"}
        if path == "/hub/api/gpuhub/gpus/mine":
            return 200, {"gpus": self.gpus}
        if path == "/hub/api/gpuhub/kernels" and self.kernels_status == 200:
            return 200, {"kernels": self.kernels}
        if path == "/hub/api/gpuhub/kernels":
            return self.kernels_status, {"status": self.kernels_status, "message": "no"}
        return 404, {"status": 404, "message": "not in this stand-in"}


@pytest.fixture
def alice_hub(hub_version):
    """Replaces conftest's stand-in: ``alice_server`` starts its server against this one."""
    hub = GPUStatusHub(hub_version)
    yield hub
    hub.close()


def status(alice_server, hub) -> dict:
    """alice's ``GET /user/alice/gpuhub-lab/status``, a little after the last one (the
    server reuses the hub's answer for 2 s)."""
    time.sleep(2.1)
    r = httpx.get(
        f"{alice_server.url}/gpuhub-lab/status",
        headers={"Authorization": f"token {hub.ALICE_TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_every_image_has_the_extension(image):
    lab = re.sub(r"\x1b\[[0-9;]*m", "", image.exec("sh", "-c", "jupyter labextension list 2>&1"))
    assert re.search(r"^\s*gpuhub-lab v0\.1\.0 enabled OK$", lab, re.M), lab
    server = re.sub(
        r"\x1b\[[0-9;]*m", "", image.exec("sh", "-c", "jupyter server extension list 2>&1")
    )
    assert re.search(r"^\s*gpuhub_lab enabled$", server, re.M), server


def test_status_is_the_hubs_answer_read_with_the_servers_own_token(alice_server, alice_hub):
    alice_hub.gpus = [HER_GPU, KERNELS_GPU]
    alice_hub.kernels = [kernel("0123456789ab", "running")]
    assert status(alice_server, alice_hub) == {
        "gpus": [HER_GPU, KERNELS_GPU],
        "kernels": alice_hub.kernels,
        "error": "",
    }
    reads = alice_hub.reads
    assert {path for path, _ in reads} == {"/hub/api/gpuhub/gpus/mine", "/hub/api/gpuhub/kernels"}
    assert {auth for _, auth in reads} == {f"token {SERVER_TOKEN}"}
    # a browser without alice's credentials reads nothing
    r = httpx.get(f"{alice_server.url}/gpuhub-lab/status", timeout=30, follow_redirects=False)
    assert r.status_code in (302, 403), r.status_code


def test_a_hub_without_gpu_kernels_is_no_error(alice_server, alice_hub):
    alice_hub.kernels_status = 404
    assert status(alice_server, alice_hub) == {"gpus": [HER_GPU], "kernels": [], "error": ""}


def test_a_hub_that_does_not_answer_is_said_in_words(alice_server, alice_hub):
    assert status(alice_server, alice_hub)["error"] == ""  # alice's token is known now
    alice_hub.close()
    assert status(alice_server, alice_hub) == {
        "gpus": [],
        "kernels": [],
        "error": "The hub does not answer; your GPU figures come back when it does.",
    }


@pytest.fixture
async def lab_page(alice_server, alice_hub):
    """Chromium on alice's JupyterLab, her token in every request's header (the stand-in hub
    has no login pages)."""
    from playwright.async_api import async_playwright

    from tests.fixtures.browser import CHROMIUM, FLAGS
    from tests.fixtures.hub import _need

    _need(os.access(CHROMIUM, os.X_OK), f"no Chromium at {CHROMIUM}; apt-get install chromium")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = await browser.new_context(
            viewport={"width": 1280, "height": 900},
            extra_http_headers={"Authorization": f"token {alice_hub.ALICE_TOKEN}"},
        )
        context.set_default_timeout(60_000)
        page = await context.new_page()
        await page.goto(f"{alice_server.url}/lab")
        try:
            yield page
        finally:
            await browser.close()


@pytest.mark.browser
async def test_the_status_bar_shows_gpus_and_a_waiting_kernels_place_and_why_one_ended(
    lab_page, alice_hub, screenshots
):
    from playwright.async_api import expect

    page = lab_page
    alice_hub.gpus = [HER_GPU]
    alice_hub.kernels = [
        kernel(
            "aaaaaaaaaaaa", "waiting", place=place(2, "Waiting for a GPU: 2nd in line, about 5 min")
        )
    ]
    item = page.locator("#gpuhub-gpu-status")
    await expect(item).to_have_text(
        "GPU 37% · 2.0 / 40.0 GiB (simulated) | GPU kernel for train.ipynb: "
        "Waiting for a GPU: 2nd in line, about 5 min",
        timeout=WAIT,
    )
    gpu = item.locator(f"[data-uuid='{HER_GPU['uuid']}']")
    await expect(gpu).to_have_attribute("title", "Simulated GPU (no driver) (" + HER_GPU["uuid"]
                                       + "), held by this server. Simulated: the demo has no "
                                       "real GPU; these are the stand-in's figures.")  # fmt: skip

    # her place moves up; then her kernel has its GPU, another is shut down by her, and a
    # third was ended by the hub: only that one is told, once
    alice_hub.kernels = [
        kernel(
            "aaaaaaaaaaaa", "waiting", place=place(1, "Waiting for a GPU: 1st in line, about 1 min")
        )
    ]
    await expect(item).to_contain_text("Waiting for a GPU: 1st in line, about 1 min", timeout=WAIT)
    alice_hub.gpus = [HER_GPU, KERNELS_GPU]
    alice_hub.kernels = [
        kernel("aaaaaaaaaaaa", "running"),
        kernel("bbbbbbbbbbbb", "ended", ended={"reason": "shutdown", "message": "You shut it."}),
        kernel("cccccccccccc", "ended", ended={"reason": "idle", "message": IDLE}),
    ]
    await expect(item).to_have_text(
        "GPU 37% · 2.0 / 40.0 GiB (simulated) | GPU kernel 81% · 30.0 / 40.0 GiB (simulated)",
        timeout=WAIT,
    )
    told = page.get_by_text(f"Your GPU kernel for train.ipynb ended: {IDLE}")
    await expect(told).to_have_count(1, timeout=WAIT)
    await expect(page.get_by_text("You shut it.")).to_have_count(0)
    await page.wait_for_timeout(8_000)  # another read of the hub: not told twice
    await expect(told).to_have_count(1)
    await screenshots.take(page, "gpu-kernel-ended", full_page=False)
