"""Issue 29's journey in a real browser: a notebook on the CPU profile runs its kernel on a GPU.

alice signs in at the OIDC provider, starts the CPU profile and opens her notebook in
JupyterLab.  The launcher lists the GPU kernel beside "Python 3" (its tooltip says how many
GPUs are free now); she changes the notebook's kernel to it with JupyterLab's own "Select
Kernel" dialog, runs a cell that prints the GPU her kernel holds, and sees that GPU in the
status bar.  bob does the same meanwhile: the hub's only GPU is alice's, so his kernel waits
in the line and his status bar says his place in words.  alice shuts her kernel down; bob's
starts by itself and his waiting cell answers.  An admin stops bob's kernel on the GPU
board, and bob's JupyterLab tells him why, in words.  The ledger, read as an admin reads it
(``gpuhub credits history``), shows each kernel's debit and refund.

Real parts: Chromium (Playwright), the OIDC provider, JupyterHub and its proxy, the
reference credits service, Docker containers of the notebook images (the CPU server's:
``GPUHUB_TEST_IMAGE``, default gpuhub/base, whose provisioner, kernelspecs and
``gpuhub_lab`` extension are under test; the GPU kernel's: ``GPUHUB_TEST_KERNEL_IMAGE``,
default gpuhub/pytorch), one simulated GPU.  The profiles are the hub's shipped ones
(:data:`hub_ext.config.DEFAULT_PROFILES`: "CPU only", and "PyTorch, 1 GPU", which offers
GPU kernels), on the images under test.  ``GPUHUB_DOCS_SCREENSHOTS=1`` keeps the steps
that docs/howto/gpu-in-jupyterlab.md (the member's) and docs/howto/gpu-kernels.md (the
board) show.

The same journey on Slurm (tests/browser/test_slurm_gpu_kernel_journey.py) runs
:func:`alice_then_bob` and :func:`kernels_paid` from here, with its own :class:`Backend`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from playwright.async_api import expect

from hub_ext.config import DEFAULT_PROFILES
from tests.browser.test_gpu_board import signed_in
from tests.browser.test_journey import grant, log_in, start_profile
from tests.fixtures.hub import NOTEBOOK_IMAGE, REPO, eventually
from tests.fixtures.oidc import ADMINS

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

KERNEL_IMAGE = os.environ.get("GPUHUB_TEST_KERNEL_IMAGE", "gpuhub/pytorch:latest")
#: the GPU kernel as JupyterLab lists it: the profile, its GPUs and price
GPU_KERNEL = "Python 3 (PyTorch, 1 GPU, 1.00 credits/h)"
CELL = "import os\nprint('My GPU:', os.environ['NVIDIA_VISIBLE_DEVICES'])"


def notebook(cell: str) -> dict:
    """``train.ipynb``: one code cell, on the server's local "Python 3" kernel."""
    return {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": cell,
                "outputs": [],
                "execution_count": None,
            }
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@dataclass(frozen=True)
class Backend:
    """What the journey reads differently on a backend: the cell that prints the kernel's
    GPU (as the hub names it), the GPU kernel's tooltip with a GPU free and with none, the
    status bar's item of the kernel's GPU, and the screenshots' names (alice's cell, bob
    waiting, bob's kernel started)."""

    cell: str
    gpu: re.Pattern
    free: str
    none_free: str
    figures: re.Pattern
    shots: tuple[str, str, str]


DOCKER = Backend(
    cell=CELL,
    gpu=re.compile(r"My GPU: (GPU-[0-9a-f-]+)"),
    free="1 of 1 GPU free now (simulated)",
    none_free="0 of 1 GPU free now (simulated)",
    # the status bar's item for a GPU kernel's GPU, on the demo's simulated GPUs
    figures=re.compile(r"^GPU kernel \d+% · [\d.]+ / [\d.]+ GiB \(simulated\)$"),
    shots=("52-gpu-kernel-cell", "53-kernel-waiting", "54-kernel-handed-on"),
)


def shipped_profiles() -> list[dict]:
    """The hub's shipped profiles as they are, on the images under test (the CPU one's:
    ``GPUHUB_TEST_IMAGE``; PyTorch's: ``GPUHUB_TEST_KERNEL_IMAGE``)."""
    profiles = copy.deepcopy(DEFAULT_PROFILES)
    images = {"cpu": NOTEBOOK_IMAGE, "pytorch": KERNEL_IMAGE}
    for profile in profiles:
        profile["spawner_override"]["image"] = images[profile["slug"]]
    return profiles


@pytest.fixture
async def kernels_hub(hub_factory, tmp_path, oidc_provider, docker_client):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(shipped_profiles()))
    hub = await hub_factory(
        extra_config="c.Line.update_interval = 0.5\nc.Kernels.check_interval = 0.5\n",
        GPUHUB_PROFILES=str(profiles),
        GPUHUB_GPUS="simulated:1",
    )
    for name in ("alice", "bob"):
        oidc_provider.member(name)
        await grant(hub, name, "10")
    yield hub
    # what the servers and kernels said (pytest shows it when the test failed)
    for container in hub.containers(docker_client):
        logs = docker_client.logs(container["Id"], tail=400).decode(errors="replace")
        print(f"--- last lines of {container['Names'][0]} ---\n{logs}")


def ledger(hub, user: str) -> str:
    """``gpuhub credits history USER``, as an admin runs it on the hub's machine."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "GPUHUB_STATE_DIR": str(hub.state_dir),
        "GPUHUB_CREDITS_PORT": hub.env["GPUHUB_CREDITS_PORT"],
    }
    env.pop("GPUHUB_CREDITS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "credits", "history", user],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def open_her_notebook(page, tmp_path, name: str, cell: str = CELL):
    """Upload ``train.ipynb`` (:func:`notebook` of ``cell``) into her workspace (``work/``)
    and open it; its panel."""
    listing = page.locator(".jp-DirListing-content")
    await listing.get_by_text("work", exact=True).dblclick()
    await expect(page.locator(".jp-FileBrowser-crumbs")).to_contain_text("work")
    path = tmp_path / name / "train.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(notebook(cell)))
    async with page.expect_file_chooser() as chooser:
        await page.locator(".jp-FileBrowser-toolbar").get_by_title("Upload Files").click()
    await (await chooser.value).set_files(path)
    await listing.get_by_text("train.ipynb", exact=True).dblclick()
    # its local kernel up (JupyterLab loses a change of kernel made while one starts)
    await expect(page.locator(".jp-StatusBar-Widget")).to_contain_text(
        "Python 3 (ipykernel) | Idle", timeout=60_000
    )
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")


async def change_kernel(page, panel, details: str, screenshots=None, shot: str = "") -> None:
    """JupyterLab's "Select Kernel" dialog, from the notebook's kernel name: the GPU kernel,
    whose choice's tooltip says ``details`` (the GPUs free now)."""
    await panel.locator(".jp-Toolbar-kernelName").click()
    dialog = page.locator(".jp-Dialog")
    choice = dialog.locator("option", has_text=GPU_KERNEL)
    await expect(choice).to_have_attribute("title", f"{GPU_KERNEL}\n{details}", timeout=15_000)
    await dialog.locator("select").select_option(label=GPU_KERNEL)
    if screenshots is not None:
        await screenshots.take(page, shot, full_page=False)
    await dialog.get_by_role("button", name="Select Kernel").click()
    await expect(panel.locator(".jp-Toolbar-kernelName")).to_have_text(GPU_KERNEL)


async def run_first_cell(page, panel) -> None:
    await panel.locator(".jp-Cell").first.locator(".cm-content").click()
    await page.keyboard.press("Shift+Enter")


async def shut_down_kernel(page) -> None:
    """JupyterLab's Kernel > Shut Down Kernel, for the notebook open in ``page``."""
    await page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Kernel$")).click()
    await page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Shut Down Kernel$")).click()


async def alice_then_bob(hub, person, tmp_path, screenshots, backend: Backend, names):
    """The journey's core, on either backend: ``alice`` (the first of ``names``; signed in
    with credits) starts the CPU profile, changes her notebook's kernel to the GPU kernel
    and runs a cell on its GPU, which her status bar shows; ``bob``'s GPU kernel waits in
    line (the hub's GPUs all taken) and his status bar says his place; alice shuts her
    kernel down and bob's starts by itself.  Returns bob's page, his notebook's panel and
    the GPU (as ``backend.gpu`` reads it)."""
    alice_name, bob_name = names
    # alice, on the CPU profile, opens her notebook
    alice = await person()
    await log_in(alice, hub, alice_name)
    await start_profile(alice, "cpu")
    await alice.wait_for_url(re.compile(f"/user/{alice_name}/lab"), timeout=180_000)
    launcher = alice.locator(".jp-Launcher")
    await expect(launcher).to_be_visible(timeout=60_000)
    # the launcher lists the GPU kernel beside "Python 3"
    cards = launcher.locator(".jp-LauncherCard[data-category='Notebook']")
    await expect(cards.filter(has_text="Python 3 (ipykernel)")).to_have_count(1)
    gpu_card = cards.filter(has_text=GPU_KERNEL)
    await expect(gpu_card).to_have_count(1)
    # with the GPUs free now where JupyterLab shows a kernel's details: its tooltip
    await expect(gpu_card).to_have_attribute(
        "title", f"{GPU_KERNEL}\n{backend.free}", timeout=15_000
    )
    if backend is DOCKER:
        await screenshots.take(alice, "50-kernel-launcher", full_page=False)

    panel = await open_her_notebook(alice, tmp_path, alice_name, backend.cell)
    shot = "51-change-kernel" if backend is DOCKER else ""
    await change_kernel(alice, panel, backend.free, screenshots if shot else None, shot)
    await run_first_cell(alice, panel)
    output = panel.locator(".jp-OutputArea-output")
    await expect(output).to_contain_text(backend.gpu, timeout=240_000)
    (gpu,) = backend.gpu.search(await output.inner_text()).groups()
    # her status bar shows that GPU (the item of its GPU: the kernel's own may still say
    # "starting" for a poll or two)
    item = alice.locator(f"#gpuhub-gpu-status .gpuhub-GPUStatus-item[data-uuid='{gpu}']")
    await expect(item).to_have_text(backend.figures, timeout=30_000)
    await expect(item).to_have_attribute("title", re.compile(re.escape(f"({gpu}), held by")))
    await screenshots.take(alice, backend.shots[0], full_page=False)

    # bob meanwhile: his GPU kernel waits in line, and JupyterLab says his place
    bob = await person()
    await log_in(bob, hub, bob_name)
    await start_profile(bob, "cpu")
    await bob.wait_for_url(re.compile(f"/user/{bob_name}/lab"), timeout=180_000)
    bobs_panel = await open_her_notebook(bob, tmp_path, bob_name, backend.cell)
    await change_kernel(
        bob,
        bobs_panel,
        f"{backend.none_free}\nIt waits in line for its GPU and starts by itself.",
    )
    bobs_status = bob.locator("#gpuhub-gpu-status")
    await expect(bobs_status).to_contain_text(
        re.compile(r"GPU kernel for train\.ipynb: Waiting for a GPU: 1st in line"), timeout=30_000
    )
    await run_first_cell(bob, bobs_panel)
    await expect(bobs_panel.locator(".jp-InputPrompt").first).to_have_text("[*]:")
    await screenshots.take(bob, backend.shots[1], full_page=False)

    # alice shuts her kernel down: bob's starts by itself, his cell answers
    await shut_down_kernel(alice)
    bobs_output = bobs_panel.locator(".jp-OutputArea-output")
    await expect(bobs_output).to_contain_text(f"My GPU: {gpu}", timeout=240_000)
    await expect(bobs_status).to_have_text(backend.figures, timeout=30_000)
    await screenshots.take(bob, backend.shots[2], full_page=False)
    return bob, bobs_panel, gpu


async def kernels_paid(hub, users) -> None:
    """The ledger, as an admin reads it: each member's GPU kernel's first interval debited
    when it started (a quarter of an hour of the shipped PyTorch profile, 1 credit/h), its
    unused part refunded at its end."""
    for user in users:

        async def settled(user=user):
            text = ledger(hub, user)
            return text if "refund" in text else None

        text = await eventually(settled, 60, f"{user}'s refund")
        kernel = rf"GPU kernel {re.escape(user)}/kernel-[0-9a-f]{{12}}"
        assert re.search(rf"debit +-0\.25 .* {kernel} for train\.ipynb \(pytorch\)", text), text
        assert re.search(rf"refund +\+0\.2\d .* of interval 0 of {kernel} for train", text), text


async def test_a_member_runs_her_notebook_on_a_gpu_kernel(
    kernels_hub, tmp_path, person, screenshots
):
    hub = kernels_hub
    bob, _, _ = await alice_then_bob(hub, person, tmp_path, screenshots, DOCKER, ("alice", "bob"))

    # an admin stops bob's kernel on the GPU board; bob reads why in JupyterLab
    boss = await hub.login("boss", groups=[ADMINS])
    board = await person()
    await signed_in(board, boss)
    await board.goto(f"{hub.url}/hub/gpus")
    row = board.locator("table.gpuhub-kernels tbody tr")
    await expect(row).to_contain_text("bob")
    await screenshots.take(board, "55-kernel-board")
    board.once("dialog", lambda dialog: dialog.accept())
    await row.locator("button.gpuhub-kernel-stop").click()
    toast = bob.locator(".jp-toast-message, .Toastify__toast")
    await expect(toast.first).to_contain_text(
        "Your GPU kernel for train.ipynb ended: The GPU kernel was stopped by boss.",
        timeout=30_000,
    )
    # the notebook shows the kernel gone, and never says it will restart: it would not
    await bob.wait_for_timeout(5000)  # a restart would be tried by now
    await expect(bob.locator(".jp-Dialog")).to_have_count(0)
    await screenshots.take(bob, "56-kernel-ended", full_page=False)
    await kernels_paid(hub, ("alice", "bob"))
