"""Issue 22's journey in a real browser: alice, in a CPU server, runs a notebook as a GPU job.

She signs in at the OIDC provider, starts the CPU profile, uploads a notebook into her
workspace with JupyterLab's file browser, right-clicks it and creates a job with Jupyter
Scheduler's own form ("Create Job" in 2.12): the PyTorch environment (its label says GPUs,
price, free GPUs) and a parameter.  bob's server holds the hub's only GPU, so the job's
detail view shows its place in the line; bob's server stops, the job runs and completes (the
Jobs list, reloaded, says so) and alice opens the executed notebook from the list: it shows
the value computed from her parameter and the UUID of the GPU the job had.

Real parts: Chromium (Playwright), the OIDC provider, JupyterHub and its proxy, the reference
credits service, Docker containers of the notebook images, one simulated GPU.  The plugin
under test is the one in the CPU profile's image (``GPUHUB_TEST_IMAGE``, default
gpuhub/base).  ``GPUHUB_DOCS_SCREENSHOTS=1`` keeps the steps docs/howto/notebook-jobs.md shows.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.async_api import expect

from tests.browser.test_journey import grant, log_in, start_profile
from tests.fixtures.hub import NOTEBOOK_IMAGE, eventually

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

PROFILES = [
    {
        "display_name": "CPU only",
        "slug": "cpu",
        "default": True,
        "spawner_override": {"image": NOTEBOOK_IMAGE},
    },
    {
        "display_name": "PyTorch",
        "slug": "pytorch",
        "gpus": 1,
        "credits_per_hour": 4,
        "spawner_override": {"image": "gpuhub/pytorch:latest"},
    },
    # a second job profile: with only one, the Scheduler's form shows no Environment list
    {
        "display_name": "Python",
        "slug": "python-gpu",
        "gpus": 1,
        "credits_per_hour": 2,
        "spawner_override": {"image": NOTEBOOK_IMAGE},
    },
]
#: a training stand-in: a papermill parameter, a few seconds of work, the GPU it was given
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "metadata": {"tags": ["parameters"]},
            "source": 'epochs = "1"',
            "outputs": [],
            "execution_count": None,
        },
        {
            "cell_type": "code",
            "metadata": {},
            "source": "import os, time\n"
            "time.sleep(4)  # training\n"
            "print('loss after', epochs, 'epochs:', 1 / 2 ** int(epochs))\n"
            "print('GPU:', os.environ['NVIDIA_VISIBLE_DEVICES'])",
            "outputs": [],
            "execution_count": None,
        },
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture
def hub_with(hub_factory, tmp_path, oidc_provider):
    """``make(profiles)``: a hub with one simulated GPU, alice a member, alice and bob 10
    credits each."""

    async def make(profiles: list[dict]):
        path = tmp_path / "profiles.json"
        path.write_text(json.dumps(profiles))
        hub = await hub_factory(
            extra_config="c.Line.update_interval = 0.5\nc.Jobs.check_interval = 0.5\n",
            GPUHUB_PROFILES=str(path),
            GPUHUB_GPUS="simulated:1",
        )
        oidc_provider.member("alice")
        for name in ("alice", "bob"):
            await grant(hub, name, "10")
        return hub

    return make


@pytest.fixture
async def jobs_hub(hub_with):
    return await hub_with(PROFILES)


async def create_job_form(alice, hub, tmp_path, screenshots=None):
    """alice signs in, starts the CPU profile, uploads her notebook into work/ with
    JupyterLab's file browser and opens Jupyter Scheduler's Create Job form on it
    (right-click > Create Job)."""
    await log_in(alice, hub, "alice")
    await start_profile(alice, "cpu")
    await alice.wait_for_url(re.compile("/user/alice/lab"), timeout=90_000)
    listing = alice.locator(".jp-DirListing-content")
    await listing.get_by_text("work", exact=True).dblclick()
    await expect(alice.locator(".jp-FileBrowser-crumbs")).to_contain_text("work")
    notebook = tmp_path / "train.ipynb"
    notebook.write_text(json.dumps(NOTEBOOK))
    async with alice.expect_file_chooser() as chooser:
        await alice.locator(".jp-FileBrowser-toolbar").get_by_title("Upload Files").click()
    await (await chooser.value).set_files(notebook)
    await listing.get_by_text("train.ipynb", exact=True).click(button="right")
    if screenshots is not None:
        await screenshots.take(alice, "30-job-menu", full_page=False)
    await alice.locator(".lm-Menu-item", has_text=re.compile(r"^Create Job$")).click()
    await expect(alice.get_by_label("Job name")).to_have_value("train")


async def reload_until(page, button: str, where, text, timeout: float = 120) -> None:
    """Press the Scheduler's ``button`` ("Reload" in the list, "Reload Job" in a job's
    detail) until ``where`` shows ``text``, as a person does: neither refreshes by itself."""

    async def shown():
        try:
            await expect(where).to_contain_text(text, timeout=1_000)
        except AssertionError:
            await page.get_by_role("button", name=button, exact=True).click()
            return False
        return True

    await eventually(shown, timeout, f"{text} shown")


async def test_a_member_runs_her_notebook_as_a_gpu_job(
    jobs_hub, docker_client, tmp_path, person, screenshots
):
    hub = jobs_hub
    # bob's server holds the only GPU
    await hub.create_user("bob")
    assert (await hub.spawn("bob", {"profile": "pytorch"})).status_code in (201, 202)
    await hub.wait_ready("bob")
    (bobs,) = [c for c in hub.containers(docker_client) if "bob" in c["Names"][0]]
    # Docker's GPU request sets it in the environment of the container's first process
    probe = docker_client.exec_create(bobs["Id"], ["cat", "/proc/1/environ"])
    env = docker_client.exec_start(probe).decode().split("\0")
    (gpu,) = [e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=GPU-")]

    # alice signs in, starts the CPU profile, uploads her notebook into work/, right-click >
    # Create Job: Jupyter Scheduler's form, the hub's environments
    alice = await person()
    await create_job_form(alice, hub, tmp_path, screenshots)
    environment = alice.get_by_role("button", name=re.compile("^Environment"))
    await environment.click()
    await alice.get_by_role("option", name="PyTorch, 1 GPU, 4.00 credits/h, 0 of 1 free").click()
    await expect(environment).to_have_text("PyTorch, 1 GPU, 4.00 credits/h, 0 of 1 free")
    await alice.get_by_role("button", name="Add new parameter").click()
    await alice.get_by_placeholder("Name", exact=True).fill("epochs")
    value = alice.get_by_placeholder("Value", exact=True)
    await value.fill("3")
    await value.blur()  # the form checks a parameter when its field loses focus
    await screenshots.take(alice, "31-job-form")
    await alice.get_by_role("button", name="Create", exact=True).click()

    # the Notebook Jobs list; the job's detail view shows its place in the line
    row = alice.locator("tr", has_text="train")
    await expect(row).to_contain_text("Queued")
    await row.get_by_title('Open detail view for "train"').click()
    place = alice.locator(".MuiAlert-message", has_text="Waiting for a GPU")
    await reload_until(alice, "Reload Job", place, re.compile(r"^Waiting for a GPU: 1st in line"))
    await screenshots.take(alice, "32-job-queued")

    # bob's server stops: the job gets the GPU, runs and completes
    await hub.stop_server("bob")
    await alice.locator(".MuiBreadcrumbs-root").get_by_text("Jobs", exact=True).click()
    await reload_until(alice, "Reload", row, "In progress", 60)
    await screenshots.take(alice, "33-job-in-progress")
    await reload_until(alice, "Reload", row, "Completed")
    await screenshots.take(alice, "34-job-completed")

    # she opens the executed notebook from the list, in JupyterLab
    await row.get_by_title(re.compile(r'^Open output file "train-.*\.ipynb"$')).click()
    output = alice.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output")
    await expect(output.filter(has_text="loss after 3 epochs: 0.125")).to_be_visible(timeout=30_000)
    await expect(output.filter(has_text=f"GPU: {gpu}")).to_be_visible()
    await screenshots.take(alice, "35-job-output")


async def test_with_one_gpu_environment_the_form_still_shows_its_gpus_price_and_free_gpus(
    hub_with, tmp_path, person
):
    """Issue 28: with a single job environment (the demo's case) the Scheduler's form shows
    no Environment list; the environment's label is shown as its compute type instead."""
    hub = await hub_with(PROFILES[:2])  # CPU only, and PyTorch: one environment runs jobs
    alice = await person()
    await create_job_form(alice, hub, tmp_path)
    await expect(alice.get_by_role("button", name=re.compile("^Environment"))).to_have_count(0)
    compute = alice.get_by_role("button", name=re.compile("^Compute type"))
    await expect(compute).to_have_text("PyTorch, 1 GPU, 4.00 credits/h, 1 of 1 free")
