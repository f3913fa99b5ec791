"""The spawn gate (hub_ext/spawn/gate.py) in a real hub: a start the hub knows it cannot
make is refused before JupyterHub's ``User.spawn`` creates anything for it.

What shows that JupyterHub's spawn never ran for a refused start: ``User.spawn`` creates
the server's OAuth client (JupyterHub logs "Creating oauth client jupyterhub-user-<name>")
and its ``User.stop`` clean-up sets the member's ``last_activity``; a member created
through the REST API and refused by the gate keeps ``last_activity`` null when the
requests are the admin service's (a member's own requests record activity).
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "PyTorch", "slug": "gpu", "gpus": 1},
]


@pytest.fixture
async def gated_hub(hub_factory, tmp_path):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps(PROFILES))

    async def make(gpus: int):
        return await hub_factory(
            GPUHUB_PROFILES=str(path), GPUHUB_CREDITS="off", GPUHUB_GPUS=f"simulated:{gpus}"
        )

    return make


async def untouched_by_jupyterhubs_spawn(hub, name: str) -> bool:
    """No OAuth client was made for ``name``'s server and no stop recorded activity."""
    model = (await hub.api("GET", f"/users/{name}")).json()
    return (
        model["last_activity"] is None
        and not model["servers"]
        and f"jupyterhub-user-{name}" not in hub.log()
    )


async def test_refused_start_is_answered_before_jupyterhub_spawns_anything(gated_hub):
    hub = await gated_hub(gpus=1)
    for name in ("alice", "carol"):
        await hub.create_user(name)
    r = await hub.spawn("alice", {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")

    r = await hub.spawn("carol", {"profile": "gpu"})
    assert r.status_code == 409, r.text  # the words and the status of a refusal in start()
    assert r.json()["message"] == (
        "No GPU free: all 1 GPUs are in use. Try the CPU profile or come back later."
    )
    assert await untouched_by_jupyterhubs_spawn(hub, "carol")

    # the spawn form says the same, with the same status, above the form
    bob = await hub.login("bob")
    xsrf = next(c.value for c in bob.cookies.jar if c.name == "_xsrf")
    r = await bob.post("/hub/spawn/bob", data={"_xsrf": xsrf, "profile": "gpu"})
    assert r.status_code == 409, r.text[:500]
    assert "No GPU free: all 1 GPUs are in use." in r.text
    assert "jupyterhub-user-bob" not in hub.log()

    # asking to wait passes the gate: the start waits in line and gets the GPU in turn
    waiting = asyncio.create_task(hub.spawn("carol", {"profile": "gpu", "wait": True}))
    try:
        await hub.stop_server("alice")
        await hub.wait_ready("carol")
        assert (await waiting).status_code in (201, 202)
    finally:
        waiting.cancel()


async def test_a_rush_gets_exactly_the_free_gpus_and_the_rest_is_refused_at_the_gate(
    gated_hub, docker_client
):
    # members click "Start" in their browsers at once; JupyterHub refreshes each one's
    # login before it spawns (refresh_pre_spawn), a wait during which the GPUs of the
    # starts already admitted must count as taken
    hub = await gated_hub(gpus=2)
    members = [f"m{i}" for i in range(8)]
    browsers = [await hub.login(name) for name in members]
    answers = await asyncio.gather(
        *(
            hub.browser_api(browser, "POST", f"/users/{name}/server", json={"profile": "gpu"})
            for name, browser in zip(members, browsers, strict=True)
        )
    )
    codes = {name: r.status_code for name, r in zip(members, answers, strict=True)}
    granted = [name for name, code in codes.items() if code in (201, 202)]
    refused = [name for name, code in codes.items() if code == 409]
    assert len(granted) == 2 and len(refused) == 6, codes
    for name in granted:
        await hub.wait_ready(name)
    devices = [c["Labels"]["io.gpuhub.devices"] for c in hub.containers(docker_client)]
    assert len(devices) == 2 and len(set(devices)) == 2, devices  # none double-booked
    # the two admitted starts claimed both GPUs before JupyterHub spawned them, so the
    # other six never reached JupyterHub's spawn
    made = [name for name in refused if f"jupyterhub-user-{name}" in hub.log()]
    assert made == [], f"OAuth clients made for refused starts: {made}"
