"""Click-to-lab on a slow link: how long a member waits, in Chromium, from the click on Start
on the spawn page until JupyterLab's launcher shows, with JupyterLab's assets compressed (the
images' ``compress_response``, images/README.md "Start-up") and as they were before, on an
emulated 20 Mbit/s link.

    .venv/bin/python benchmarks/lab_load.py [--runs 5] [--mbit 20] [--latency-ms 20]
                                            [--image gpuhub/base:latest]

A real hub and configurable-http-proxy (:class:`tests.fixtures.hub.Hub`, the Docker backend,
credits off), the OIDC provider stand-in and Debian's Chromium through Playwright
(``tests/fixtures/browser.py``'s flags).  Two CPU profiles run the same image: ``gzip``, as
it is, and ``plain``, whose server gets ``--ServerApp.tornado_settings={}`` (tornado's
default, no compression: what images served before).  Each run is a browser context of its
own, so the cache is empty, as at a member's first load: she signs in at full speed, then
the link is slowed (Chrome DevTools' ``Network.emulateNetworkConditions`` on her page:
download and upload at ``--mbit``, ``--latency-ms`` added to each request), and the clock
runs from the click on Start (the server starts, the progress page, JupyterLab's page and
its assets) until a launcher card is visible.  The server is stopped after each run.  Runs
alternate which profile goes first; prints each median, the bytes received over the wire
(``Network.loadingFinished``'s ``encodedDataLength``) and the saving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fixtures.browser import CHROMIUM, FLAGS  # noqa: E402
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402

MEMBER = "bench"
#: the server's option that turns compression off again (tornado's default settings)
UNCOMPRESSED = ["jupyterhub-singleuser", "--ServerApp.tornado_settings={}"]
VARIANTS = ("plain", "gzip")


def profiles(image: str) -> list[dict]:
    common = {"spawner_override": {"image": image}}
    return [
        {"display_name": "gzip", "slug": "gzip", "default": True, **common},
        {
            "display_name": "plain",
            "slug": "plain",
            "spawner_override": {"image": image, "cmd": UNCOMPRESSED},
        },
    ]


async def sign_in(page, hub: Hub) -> None:
    """The member's sign-in as in ``tests/browser/test_journey.py``: to the spawn page."""
    await page.goto(hub.url + "/hub/")
    await page.get_by_text("Sign in with").click()
    await page.get_by_placeholder("sub").fill(MEMBER)
    await page.get_by_role("button", name="Authorize").click()
    await page.wait_for_url(f"{hub.url}/hub/spawn**")


async def click_to_lab(browser, hub: Hub, variant: str, mbit: float, latency_ms: float):
    """One member's first load: seconds from Start to the launcher, seconds of that from
    JupyterLab's page (its navigation committed) to the launcher, bytes received."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(120_000)
    try:
        page = await context.new_page()
        await sign_in(page, hub)
        cdp = await context.new_cdp_session(page)
        received = []
        cdp.on("Network.loadingFinished", lambda e: received.append(e["encodedDataLength"]))
        await cdp.send("Network.enable")
        rate = mbit * 1e6 / 8  # bytes per second
        await cdp.send(
            "Network.emulateNetworkConditions",
            {
                "offline": False,
                "latency": latency_ms,
                "downloadThroughput": rate,
                "uploadThroughput": rate,
            },
        )
        await page.locator(f".gpuhub-card[data-profile={variant}]").click()
        start = time.monotonic()
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_url(f"{hub.url}/user/{MEMBER}/lab**", wait_until="commit")
        lab = time.monotonic()
        await page.locator(".jp-LauncherCard").first.wait_for(state="visible")
        end = time.monotonic()
        return end - start, end - lab, sum(received)
    finally:
        await context.close()
        await hub.stop_server(MEMBER)


async def main(runs: int, mbit: float, latency_ms: float, image: str) -> None:
    from playwright.async_api import async_playwright

    seconds = {v: [] for v in VARIANTS}
    lab_part = {v: [] for v in VARIANTS}
    wire = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp, running_provider(Path(tmp) / "oidc.log") as oidc:
        path = Path(tmp) / "profiles.json"
        path.write_text(json.dumps(profiles(image)))
        oidc.member(MEMBER)
        hub = Hub(
            Path(tmp),
            {"GPUHUB_PROFILES": str(path), "GPUHUB_CREDITS": "off"},
            extra_config="c.JupyterHub.log_level = 'INFO'\n",
            oidc=oidc,
        )
        await hub.start()
        try:
            await hub.create_user(MEMBER)
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                try:
                    for variant in VARIANTS:  # warm-up: the image's pages in the OS cache
                        await click_to_lab(browser, hub, variant, mbit, latency_ms)
                    for i in range(runs):
                        for variant in VARIANTS[::-1] if i % 2 else VARIANTS:
                            took, lab, size = await click_to_lab(
                                browser, hub, variant, mbit, latency_ms
                            )
                            seconds[variant].append(took)
                            lab_part[variant].append(lab)
                            wire[variant].append(size)
                            print(
                                f"run {i + 1} {variant}: {took:.2f} s (JupyterLab's page "
                                f"{lab:.2f} s), {size / 1e6:.2f} MB"
                            )
                finally:
                    await browser.close()
        finally:
            await hub.close(docker.APIClient())
    print(
        f"\nclick-to-lab in Chromium, {image}, {mbit:g} Mbit/s, +{latency_ms:g} ms a request, "
        f"{runs} runs each, empty cache; load average {os.getloadavg()[0]:.2f} "
        f"({os.cpu_count()} cores)"
    )
    med = {v: statistics.median(seconds[v]) for v in VARIANTS}
    lab = {v: statistics.median(lab_part[v]) for v in VARIANTS}
    for variant in VARIANTS:
        print(
            f"  {variant:<5}: click-to-lab median {med[variant]:.2f} s "
            f"(runs {[round(x, 2) for x in seconds[variant]]}); of it JupyterLab's page to "
            f"its launcher {lab[variant]:.2f} s; {statistics.median(wire[variant]) / 1e6:.2f} "
            "MB received"
        )
    for what, m in (("click-to-lab time", med), ("time from JupyterLab's page", lab)):
        print(
            f"  gzip saves {m['plain'] - m['gzip']:.2f} s "
            f"({1 - m['gzip'] / m['plain']:.0%}) of the {what}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mbit", type=float, default=20.0, help="link speed, both ways")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to each request")
    parser.add_argument(
        "--image", default=os.environ.get("GPUHUB_TEST_IMAGE", "gpuhub/base:latest")
    )
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.mbit, args.latency_ms, args.image))
