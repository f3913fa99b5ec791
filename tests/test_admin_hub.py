"""The GPU board in a real hub: who may see it and what it shows.

Real JupyterHub, proxy, Docker, the NVML stand-in and the reference credits service.
``boss`` is in the admin group (``hub-admins``); ``alice`` is a member.  The page itself, in
Chromium, is in ``tests/browser/test_gpu_board.py``.
"""

from __future__ import annotations

import pytest

from tests.fixtures.oidc import ADMINS

pytestmark = [pytest.mark.docker, pytest.mark.hub]

FREE, OUTSIDE, SICK = (f"GPU-11111111-2222-3333-4444-00000000000{i}" for i in range(3))
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
]


def node(utilization: int = 0) -> dict:
    """Three GPUs: one free (at ``utilization``), one used outside the hub, one unhealthy."""
    return {
        "devices": [
            {
                "uuid": FREE,
                "name": "Stand-in",
                "memory_total_mib": 16384,
                "memory_used_mib": 1024,
                "utilization_gpu": utilization,
            },
            {
                "uuid": OUTSIDE,
                "name": "Stand-in",
                "memory_total_mib": 16384,
                "processes": [{"pid": 31337, "used_memory_mib": 2048}],
                "utilization_gpu": 99,
            },
            {
                "uuid": SICK,
                "name": "Stand-in",
                "memory_total_mib": 16384,
                "ecc_uncorrected_volatile": 2,
            },
        ]
    }


async def test_only_admins_see_the_gpu_board(gpu_hub):
    hub = await gpu_hub(node(), PROFILES)
    boss = await hub.login("boss", groups=[ADMINS])
    alice = await hub.login("alice")
    alice_token = await hub.create_user("alice")

    assert 'href="/hub/gpus"' not in (await alice.get("/hub/home")).text
    assert 'href="/hub/gpus"' in (await boss.get("/hub/home")).text  # in the navigation bar
    r = await alice.get("/hub/gpus", follow_redirects=False)
    assert r.status_code == 403, r.text[:500]
    assert "Only admins may see the GPU board." in r.text
    assert (await hub.browser_api(alice, "GET", "/gpuhub/gpus")).status_code == 403
    assert (await hub.api("GET", "/gpuhub/gpus", token=alice_token)).status_code == 403
    anonymous = await hub.client.get("/hub/api/gpuhub/gpus")
    assert anonymous.status_code == 403
    page = await hub.client.get("/hub/gpus", follow_redirects=False)
    assert page.status_code == 302 and "/hub/login" in page.headers["location"]

    r = await hub.browser_api(boss, "GET", "/gpuhub/gpus")
    assert r.status_code == 200, r.text
    devices = {d["uuid"]: d for d in r.json()["devices"]}
    assert devices[FREE]["state"] == "free"
    assert devices[OUTSIDE]["state"] == "outside"
    assert devices[OUTSIDE]["processes"] == [{"pid": 31337, "used_memory_mib": 2048}]
    assert devices[SICK]["state"] == "unhealthy"
    assert "ECC" in devices[SICK]["health_reason"]
    assert r.json()["summary"] == {
        "total": 3,
        "free": 1,
        "allocated": 0,
        "outside": 1,
        "unhealthy": 1,
    }
    r = await boss.get("/hub/gpus")
    assert r.status_code == 200
    assert "outside: pid 31337" in r.text
    assert "unhealthy: 2 volatile uncorrectable ECC error(s)" in r.text
