"""The README's first command, ``scripts/demo.sh``, serves a hub people can sign in to.

The demo is run as a person runs it (its own OIDC provider, its own credits service,
simulated GPUs where NVML finds no driver), on ports and names of its own so that it
never meets another hub.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import time
from types import SimpleNamespace

import httpx
import pytest
from jupyterhub.utils import random_port

from tests.fixtures.hub import REPO
from tests.fixtures.oidc import oidc_login

pytestmark = [pytest.mark.docker, pytest.mark.hub]


@pytest.fixture
async def demo(tmp_path, docker_client, notebook_image):
    hub_id = "d" + secrets.token_hex(4)
    port = random_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "JUPYTERHUB_"))},
        "GPUHUB_PORT": str(port),
        "GPUHUB_HUB_PORT": str(random_port()),
        "GPUHUB_PROXY_API_PORT": str(random_port()),
        "GPUHUB_CREDITS_PORT": str(random_port()),
        "GPUHUB_DEMO_OIDC_PORT": str(random_port()),
        "GPUHUB_STATE_DIR": str(tmp_path / "var"),
        "GPUHUB_HUB_ID": hub_id,
        "GPUHUB_CONTAINER_PREFIX": f"{hub_id}-jupyter",
        "GPUHUB_WORKSPACE": f"{hub_id}-user-{{username}}",
    }
    log = open(tmp_path / "demo.log", "wb")
    proc = subprocess.Popen(["bash", "scripts/demo.sh"], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # setup.sh first: quick when all is there
        async with httpx.AsyncClient() as client:
            while True:
                assert proc.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
                try:
                    if (await client.get(url + "/hub/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, (tmp_path / "demo.log").read_text()[-3000:]
                await asyncio.sleep(0.5)
        yield SimpleNamespace(url=url, log=tmp_path / "demo.log", env=env)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-f", str(tmp_path / "var")], check=False)
        for c in docker_client.containers(all=True, filters={"label": f"io.gpuhub.hub={hub_id}"}):
            docker_client.remove_container(c["Id"], force=True)
        for volume in docker_client.volumes(filters={"name": hub_id})["Volumes"] or []:
            docker_client.remove_volume(volume["Name"])
        log.close()


async def test_the_readme_demo_serves_a_hub_members_sign_in_to(demo):
    url, log = demo.url, demo.log
    async with httpx.AsyncClient(timeout=30) as alice:
        r = await oidc_login(alice, url, "alice")
        assert r.status_code == 302, r.text
        page = await alice.get(url + "/hub/spawn", follow_redirects=True)
        assert page.status_code == 200
        assert "(simulated GPUs)" in page.text  # labelled where NVML finds no driver
        assert "10.00 credits" in page.text  # the demo's initial grant
    async with httpx.AsyncClient(timeout=30) as mallory:
        r = await oidc_login(mallory, url, "mallory")
        assert r.status_code == 403
        assert "Not a member of this hub" in r.text
    assert "SIMULATED node of 2 GPUs" in log.read_text()


async def test_gpuhub_credits_finds_the_demos_own_credits_service(demo):
    async with httpx.AsyncClient(timeout=30) as bob:
        assert (await oidc_login(bob, demo.url, "bob")).status_code == 302  # 10 credits
    # an operator on the hub's machine, with the hub's settings and nothing else
    env = {**demo.env, "GPUHUB_CREDITS_URL": ""}
    gpuhub = [str(REPO / ".venv" / "bin" / "gpuhub"), "credits"]
    out = subprocess.run([*gpuhub, "grant", "bob", "5"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert "Granted 5.00 credits to bob. Balance: 15.00" in out
    out = subprocess.run([*gpuhub, "balance", "bob"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "bob: 15.00 credits"
