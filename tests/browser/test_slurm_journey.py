"""The browser journey on the Slurm backend: the same pages as on Docker, the server a Slurm
job on one of the test cluster's two nodes.

Everything is real: Chromium (Playwright), the OIDC provider's sign-in page, JupyterHub and
its proxy, batchspawner, slurmctld and two slurmd nodes (tests/fixtures/slurm.py), the
notebook image in the nodes' container runtime, JupyterLab and its terminal.  Screenshots
go to ``artifacts/browser/<test>/``.
"""

from __future__ import annotations

import pwd
import re

import pytest
from playwright.async_api import expect

from tests.browser.test_gpu_board import signed_in
from tests.browser.test_journey import card, log_in, open_terminal, start_profile, terminal_says
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import ADMINS

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker, pytest.mark.browser]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
]
MEMBER = "ghb-erin"
# her uid, the GPUs Slurm gave the job, and the GPU device files her container sees
PROBE = "echo GPUHUB:$(id -u):$SLURMD_NODENAME:$SLURM_JOB_GPUS:$(ls /dev | grep -c '^nvidia'):END"
PROBE_RE = re.compile(r"GPUHUB:(\d+):(node\d+):(\d+):(\d+):END")


async def test_a_members_journey_on_slurm_and_the_admin_stops_her_from_the_board(
    slurm_hub, slurm_cluster, oidc_provider, person, screenshots
):
    uid = slurm_cluster.member(MEMBER)
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    oidc_provider.member(MEMBER)

    # 1. she signs in at the provider and sees the cards, free GPUs read from Slurm
    erin = await person()
    await log_in(erin, hub, MEMBER)
    gpu = card(erin, "gpu")
    await expect(gpu).to_contain_text(re.compile(r"[1-4] of 4 GPUs free now"))
    await expect(gpu.locator("input[type=radio]")).to_be_enabled()
    await screenshots.take(erin, "01-spawn-page")

    # 2. she starts the GPU profile and lands in JupyterLab, on a Slurm node
    await start_profile(erin, "gpu")
    await erin.wait_for_url(re.compile(rf"/user/{MEMBER}/lab"), timeout=180_000)
    terminal = await open_terminal(erin, MEMBER)
    seen = await terminal_says(erin, terminal, PROBE, PROBE_RE)
    assert int(seen[1]) == uid == pwd.getpwnam(MEMBER).pw_uid  # her own uid, not root
    node, gpu_index, devices = seen[2], seen[3], int(seen[4])
    assert devices == 1  # only the one GPU Slurm gave her job
    await screenshots.take(erin, "02-terminal")

    # 3. the admin reads the board: her job holds that GPU of that node; Stop cancels it
    boss = await hub.login("boss", groups=[ADMINS])
    board = await person()
    await signed_in(board, boss)
    await board.goto(f"{hub.url}/hub/gpus")
    row = board.locator(f'tr[data-uuid="{node}/gpu{gpu_index}"]')
    assert await row.locator(".gpuhub-owner").inner_text() == MEMBER
    assert await row.locator(".gpuhub-profile").inner_text() == "gpu"
    assert await row.locator(".gpuhub-state").inner_text() == "held"
    await expect(board.locator(f'tr[data-node="{node}"]')).to_contain_text("of 2")
    await screenshots.take(board, "03-gpu-board")
    [job] = slurm_cluster.run("squeue", "-h", "-u", MEMBER, "-o", "%i").stdout.split()

    board.once("dialog", lambda dialog: dialog.accept())
    await row.locator("button.gpuhub-stop").click()
    await row.locator(".gpuhub-state", has_text="free").wait_for(timeout=60_000)
    assert await row.locator(".gpuhub-owner").inner_text() == ""
    await eventually(lambda: hub.stopped(MEMBER), 60, f"{MEMBER}'s server stopped")
    slurm_cluster.wait_for(
        "her job to end", lambda: slurm_cluster.job_state(job) in ("", "CANCELLED")
    )
