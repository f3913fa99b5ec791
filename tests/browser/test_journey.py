"""A person's whole path through the hub, in a real browser.

Everything is real: Chromium (Playwright), the OIDC provider's sign-in page, JupyterHub and
its proxy, the reference credits service the hub runs, Docker containers on a simulated
two-GPU node, JupyterLab and its terminal.  Each step leaves a screenshot in
``artifacts/browser/<test>/``; ``GPUHUB_DOCS_SCREENSHOTS=1`` also refreshes the ones the
README shows (``docs/screenshots/``).
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from playwright.async_api import expect

from hub_ext.credits.client import CreditsClient
from hub_ext.credits.hubconfig import ADMIN_TOKEN_FILE

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

# 4 credits per hour: the first 15-minute interval costs 1.00
PROFILES = [
    {
        "display_name": "CPU only",
        "slug": "cpu",
        "default": True,
        "description": "JupyterLab and the scientific Python stack, no GPU.",
        "spawner_override": {"image": "gpuhub/base:latest"},
    },
    {
        "display_name": "PyTorch, 1 GPU",
        "slug": "pytorch",
        "gpus": 1,
        "credits_per_hour": 4,
        "description": "PyTorch on one exclusive GPU.",
        "spawner_override": {"image": "gpuhub/pytorch:latest"},
    },
]
PROBE = "echo GPUHUB:$NVIDIA_VISIBLE_DEVICES:$(id -u):END"
PROBE_RE = re.compile(r"GPUHUB:(GPU-[0-9a-f-]+):(\d+):END")
# What a member types first, in the terminal (a login shell) and in a notebook: the image's
# Python with its framework, and the GPU the hub gave the server. The answer is the torch
# version and the device UUID, which the typed line itself does not contain.
TORCH_CELL = "import torch, os; print(torch.__version__, os.environ['NVIDIA_VISIBLE_DEVICES'])"
TORCH_PROBE = f'python -c "{TORCH_CELL}"'
TORCH_RE = re.compile(r"(\d+\.\d+\.\d+\S*) (GPU-[0-9a-f-]+)")
# Records the lines of the spawn page's event log as they appear: the page reloads into
# JupyterLab the moment the server is ready, taking the log with it.
RECORD_PROGRESS = """
new MutationObserver(function (mutations) {
  for (const m of mutations) for (const node of m.addedNodes) {
    if (node.classList && node.classList.contains("progress-log-event")) {
      window.gpuhubProgress(node.textContent);
    }
  }
}).observe(document, {childList: true, subtree: true});
"""
# xterm.js draws on a canvas; its screen-reader mode (a JupyterLab terminal setting) also
# keeps the rows as text, which is what the test reads.
SCREEN_READER = """
async function (url) {
  const xsrf = document.cookie.split("; ").find(c => c.startsWith("_xsrf="));
  const r = await fetch(url, {
    method: "PUT",
    headers: {"Content-Type": "application/json",
              "X-XSRFToken": xsrf ? decodeURIComponent(xsrf.slice(6)) : ""},
    body: JSON.stringify({raw: JSON.stringify({screenReaderMode: true})}),
  });
  return r.status;
}
"""


async def grant(hub, user: str, amount: str) -> None:
    """Grant credits with the admin token of the reference service the hub runs."""
    token = (hub.state_dir / ADMIN_TOKEN_FILE).read_text().strip()
    url = f"http://127.0.0.1:{hub.env['GPUHUB_CREDITS_PORT']}/services/credits/"
    async with CreditsClient(url=url, token=token) as client:
        await client.grant(user, amount, key=f"journey-{uuid.uuid4().hex}")


async def log_in(page, hub, name: str) -> None:
    """Open the hub, follow its sign-in button to the provider, and sign in as ``name``."""
    await page.goto(hub.url + "/hub/")
    await page.get_by_text(re.compile("Sign in with")).click()
    await page.get_by_placeholder("sub").fill(name)
    await page.get_by_role("button", name="Authorize").click()
    await page.wait_for_url(re.compile(rf"{re.escape(hub.url)}/hub/spawn"))


def card(page, slug: str):
    return page.locator(f".gpuhub-card[data-profile={slug}]")


async def start_profile(page, slug: str) -> None:
    await card(page, slug).click()
    await page.get_by_role("button", name="Start").click()


async def open_terminal(page, user: str):
    """Open a Terminal from JupyterLab's launcher; return it once its prompt shows."""
    status = await page.evaluate(
        SCREEN_READER, f"/user/{user}/lab/api/settings/@jupyterlab/terminal-extension:plugin"
    )
    assert status in (200, 204), status
    await page.reload()  # JupyterLab reads its settings when it loads
    await page.locator(".jp-LauncherCard[title*='terminal' i]").first.click()
    terminal = page.locator(".jp-Terminal")
    await expect(terminal.locator(".xterm-accessibility-tree")).to_contain_text("$")
    return terminal


async def terminal_says(page, terminal, command: str, answer: re.Pattern) -> re.Match:
    """Type ``command`` into ``terminal``; wait until its screen shows ``answer``."""
    await terminal.click()
    await page.keyboard.type(command + "\n")
    rows = terminal.locator(".xterm-accessibility-tree")
    await expect(rows).to_contain_text(answer, timeout=30_000)
    return answer.search(await rows.inner_text())


async def notebook_says(page, code: str) -> str:
    """Open a Python notebook from JupyterLab's launcher, run ``code`` in its first cell and
    return what the cell printed.

    As a person would, it waits for the kernel before typing and, when the cell comes back
    empty and unrun (JupyterLab can load the new file's contents over what was typed while
    the document opened), types it again: at most three tries.
    """
    await page.get_by_title(re.compile("New Launcher")).first.click()
    await page.locator(".jp-LauncherCard[data-category='Notebook']").first.click()
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    await expect(panel.locator(".jp-Notebook-ExecutionIndicator")).to_have_attribute(
        "data-status", "idle", timeout=60_000
    )
    cell = panel.locator(".jp-Notebook .jp-Cell").first
    editor = cell.locator(".cm-content")
    prompt = cell.locator(".jp-InputPrompt")  # "[ ]:" unrun, "[*]:" running, "[1]:" ran
    output = cell.locator(".jp-OutputArea-output")
    for attempt in range(3):
        await editor.click()
        await page.keyboard.press("ControlOrMeta+a")
        await page.keyboard.type(code)
        await expect(editor).to_have_text(code)
        await page.keyboard.press("Shift+Enter")
        try:
            await expect(output).not_to_be_empty(timeout=20_000)
            return await output.inner_text()
        except AssertionError:
            # running (the kernel imports torch: slow on a loaded machine) or run: wait
            if re.search(r"\[(\*|\d+)\]", await prompt.inner_text()):
                await expect(output).not_to_be_empty(timeout=90_000)
                return await output.inner_text()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


# A server can be up within a second of the click, and JupyterHub then sends the member
# from /hub/spawn-pending straight on to the server: the progress page would flash past
# (or never load) on a fast machine. This hook, after the credits debit, holds each start
# for 3 s, as a slower node or a bigger image would, so the page and its events are there
# to read. Defined in the hub's config file: the hub imports hub_ext only.
LINGER_AFTER_DEBIT = """
import asyncio
from traitlets.config import SingletonConfigurable

from hub_ext.spawn.hooks import Hook

class LingerAfterDebit(Hook, SingletonConfigurable):
    name = "linger"

    async def before_container(self, spawner):
        await asyncio.sleep(3)

    async def undo(self, spawner):
        pass

c.GPUDockerSpawner.before_container_hooks.append(LingerAfterDebit.instance())
"""


@pytest.fixture
async def journey_hub(hub_factory, tmp_path, oidc_provider):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(PROFILES))
    hub = await hub_factory(extra_config=LINGER_AFTER_DEBIT, GPUHUB_PROFILES=str(profiles))
    for name in ("alice", "bob", "carol", "dave"):
        oidc_provider.member(name)
    for name, amount in (("alice", "10"), ("bob", "10"), ("carol", "10"), ("dave", "0.50")):
        await grant(hub, name, amount)
    return hub


def framework_version(docker_client, slug: str) -> str:
    """The framework version the image of profile ``slug`` declares in its label
    ``io.gpuhub.framework.version`` (set by images/*/Dockerfile), read through Docker."""
    (profile,) = (p for p in PROFILES if p["slug"] == slug)
    image = docker_client.inspect_image(profile["spawner_override"]["image"])
    return image["Config"]["Labels"]["io.gpuhub.framework.version"]


async def test_a_members_journey(journey_hub, docker_client, person, screenshots):
    hub = journey_hub

    # 1. alice opens the hub and signs in at the organisation's provider
    alice = await person()
    progress: list[str] = []
    await alice.expose_function("gpuhubProgress", lambda line: progress.append(line))
    await alice.add_init_script(RECORD_PROGRESS)
    await log_in(alice, hub, "alice")

    # 2. the spawn page: what each profile holds, costs, and how many GPUs are free
    pytorch = card(alice, "pytorch")
    await expect(pytorch).to_contain_text("2 of 2 GPUs free now")
    await expect(pytorch).to_contain_text("4.00 credits per hour")
    torch = framework_version(docker_client, "pytorch")  # what the image says it carries
    await expect(pytorch).to_contain_text(re.compile(r"PyTorch\s*" + re.escape(torch)))
    await expect(card(alice, "cpu")).to_contain_text("Free")
    await expect(alice.locator(".gpuhub-balance")).to_have_text("10.00 credits")
    await screenshots.take(alice, "02-spawn-page")

    # bob has the spawn page open all along
    bob = await person()
    await log_in(bob, hub, "bob")
    await expect(card(bob, "pytorch")).to_contain_text("2 of 2 GPUs free now")

    # 3. alice starts PyTorch; the progress page shows the hub's own steps
    await start_profile(alice, "pytorch")
    await alice.wait_for_url(re.compile("/hub/spawn-pending/alice"))
    await expect(alice.locator("#progress-details")).to_have_attribute("open", "")
    await alice.locator(".progress-log-event").first.wait_for()
    await screenshots.take(alice, "03-progress")
    await alice.wait_for_url(re.compile("/user/alice/lab"), timeout=90_000)
    steps = "\n".join(progress)
    for step in ("Reserving 1 GPU", "Debiting 1.00 credits", "Starting container"):
        assert step in steps, progress

    # 4. JupyterLab; a terminal shows her GPU and that she is not root
    await expect(alice.locator(".jp-Launcher")).to_be_visible(timeout=60_000)
    terminal = await open_terminal(alice, "alice")
    devices, uid = (await terminal_says(alice, terminal, PROBE, PROBE_RE)).groups()
    assert int(uid) == 1000
    # the terminal is a login shell: `python` is the image's, with torch, and sees her GPU
    torch_version, visible = (await terminal_says(alice, terminal, TORCH_PROBE, TORCH_RE)).groups()
    assert torch_version == torch and visible == devices
    await screenshots.take(alice, "04-terminal")
    # and so is a notebook's kernel
    answer = await notebook_says(alice, TORCH_CELL)
    assert TORCH_RE.search(answer).groups() == (torch_version, devices), answer
    await screenshots.take(alice, "04-notebook")

    # 5. bob's page, never reloaded, now shows one GPU fewer; he takes the last one
    await expect(card(bob, "pytorch")).to_contain_text("1 of 2 GPUs free now", timeout=15_000)
    await screenshots.take(bob, "05-one-gpu-fewer")
    await start_profile(bob, "pytorch")
    await bob.wait_for_url(re.compile("/user/bob/lab"), timeout=90_000)

    # the pool is empty: carol's GPU profile is disabled and says why, on a phone too
    carol = await person(phone=True)
    await log_in(carol, hub, "carol")
    carols = card(carol, "pytorch")
    await expect(carols).to_contain_text("No GPU free: all 2 GPUs are in use")
    await expect(carols.locator("input[type=radio]")).to_be_disabled()
    await screenshots.take(carol, "06-pool-empty")

    # 6. alice stops her server from the hub's home page; carol's page frees up, live
    await alice.goto(hub.url + "/hub/home")
    await expect(alice.locator(".gpuhub-balance")).to_have_text("9.00 credits")
    await alice.get_by_role("button", name=re.compile("Stop My Server")).click()
    await expect(alice.get_by_role("button", name=re.compile("Start My Server"))).to_be_visible(
        timeout=60_000
    )
    await screenshots.take(alice, "08-home-stop")
    await alice.reload()  # the unused part of the first interval came back
    await expect(alice.locator(".gpuhub-balance")).to_have_text(re.compile(r"^9\.9\d credits$"))
    await expect(carols).to_contain_text("1 of 2 GPUs free now", timeout=15_000)
    await expect(carols.locator("input[type=radio]")).to_be_enabled()
    await screenshots.take(carol, "09-gpu-free-again")

    # a member whose balance cannot pay the first interval reads why before clicking,
    # and a forged submit is refused at once with the same sentence
    dave = await person()
    await log_in(dave, hub, "dave")
    daves = card(dave, "pytorch")
    await expect(daves).to_contain_text(
        "This profile costs 4.00 credits per hour; your balance is 0.50"
    )
    await expect(daves.locator("input[type=radio]")).to_be_disabled()
    await screenshots.take(dave, "07-no-credits")
    await daves.locator("input[type=radio]").evaluate("r => { r.disabled = false; }")
    await start_profile(dave, "pytorch")
    await expect(dave.locator("body")).to_contain_text("your balance is 0.50")
    await screenshots.take(dave, "07-no-credits-refused")


async def test_the_spawn_page_works_without_javascript(journey_hub, person, screenshots):
    hub = journey_hub
    bob = await person(javascript=False)
    await log_in(bob, hub, "bob")
    pytorch = card(bob, "pytorch")
    await expect(pytorch).to_contain_text("2 of 2 GPUs free now")  # rendered by the hub
    await screenshots.take(bob, "no-js-spawn-page")
    await start_profile(bob, "pytorch")  # a plain form post
    await bob.wait_for_url(re.compile("/hub/spawn-pending/bob"))
    await expect(bob.locator("body")).to_contain_text("Your server is starting up")
    model = await hub.wait_ready("bob")
    assert model["user_options"] == {"profile": "pytorch"}
    await bob.reload()  # what a person without JavaScript does: the hub sends them on
    await bob.wait_for_url(re.compile("/user/bob/"))
