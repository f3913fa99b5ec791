"""The pool inside a real hub, reading GPUs through real pynvml and the NVML stand-in.

Restarts (clean and ``kill -9``), containers removed behind the hub's back, and processes
that run on a GPU outside the hub.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = json.dumps(
    [
        {"display_name": "CPU only", "slug": "cpu", "default": True},
        {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
        {
            "display_name": "Hangs",
            "slug": "hangs",
            "gpus": 1,
            "spawner_override": {"cmd": ["sh", "-c", "sleep 600", "--"]},
        },
    ]
)


def gpus(n, extra=None):
    """A stand-in node of ``n`` GPUs; ``extra`` maps an index to more keys for it."""
    extra = extra or {}
    return {
        "devices": [
            {
                "uuid": f"GPU-11111111-2222-3333-4444-{i:012d}",
                "name": "Stand-in",
                "memory_total_mib": 16384,
                **extra.get(i, {}),
            }
            for i in range(n)
        ]
    }


@pytest.fixture
async def nvml_hub(hub_factory, nvml_node, tmp_path):
    """A hub factory whose GPUs come from the NVML stand-in (GPUHUB_GPUS=nvml)."""
    profiles = tmp_path / "profiles.json"
    profiles.write_text(PROFILES)

    async def make(doc, extra_config=""):
        nvml_node.write(doc)
        return await hub_factory(
            extra_config="c.GPUPool.refresh_interval = 0.2\n" + extra_config,
            GPUHUB_GPUS="nvml",
            GPUHUB_PROFILES=str(profiles),
            **nvml_node.env,
        )

    return make


async def gauge(hub, state: str) -> float:
    """gpuhub_gpus{state=...} from the hub's /hub/metrics."""
    r = await hub.client.get("/hub/metrics", headers={"Authorization": f"token {hub.admin_token}"})
    r.raise_for_status()
    m = re.search(rf'^gpuhub_gpus{{state="{state}"}} ([0-9.]+)$', r.text, re.M)
    assert m, r.text[:2000]
    return float(m.group(1))


def held_devices(hub, docker_client) -> list[str]:
    return [
        c["Labels"]["io.gpuhub.devices"]
        for c in hub.containers(docker_client)
        if c["State"] == "running" and c["Labels"]["io.gpuhub.devices"]
    ]


async def spawn_ready(hub, user, profile="gpu"):
    r = await hub.spawn(user, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(user)


@pytest.mark.parametrize(
    "how",
    [pytest.param(signal.SIGTERM, id="clean-restart"), pytest.param(signal.SIGKILL, id="kill-9")],
)
async def test_restart_restores_both_allocations(nvml_hub, docker_client, how):
    hub = await nvml_hub(gpus(3))
    for user in ("alice", "bob", "carol", "dave"):
        await hub.create_user(user)
    await spawn_ready(hub, "alice")
    await spawn_ready(hub, "bob")
    before = sorted(held_devices(hub, docker_client))

    await hub.restart(how)

    assert sorted(held_devices(hub, docker_client)) == before  # servers survived
    await spawn_ready(hub, "carol")  # the one free GPU
    assert await gauge(hub, "free") == 0
    r = await hub.spawn("dave", {"profile": "gpu"})
    assert r.status_code == 409, r.text
    assert "all 3 GPUs are in use" in r.json()["message"]
    held = held_devices(hub, docker_client)
    assert len(held) == len(set(held)) == 3


async def test_kill_9_mid_spawn_leaks_nothing_and_books_nothing_twice(nvml_hub, docker_client):
    hub = await nvml_hub(gpus(2), extra_config="c.GPUDockerSpawner.http_timeout = 5\n")
    for user in ("alice", "bob", "carol"):
        await hub.create_user(user)
    # the request is not awaited: its answer would come after about 10 s, when the
    # server's time-outs (5 s ours, 5 s the hub's) and slow_spawn_timeout (10 s) race to
    # make it a 500 or a 202; the kill comes as soon as the container exists
    spawn = asyncio.create_task(hub.spawn("alice", {"profile": "hangs"}))
    for _ in range(100):
        if hub.containers(docker_client):
            break
        await asyncio.sleep(0.1)
    assert hub.containers(docker_client), "the container was never created"
    assert not spawn.done()  # still mid-spawn
    hub.kill(signal.SIGKILL)
    spawn.cancel()
    await hub.start()
    # whatever the restarted hub decides about alice's half-started server, her device
    # is either still held by her live container or free again - never both
    for _ in range(300):
        model = (await hub.api("GET", "/users/alice")).json()["servers"].get("")
        if not model or not model.get("pending"):
            break
        await asyncio.sleep(0.1)
    alice_alive = bool(held_devices(hub, docker_client))
    await spawn_ready(hub, "bob")
    r = await hub.spawn("carol", {"profile": "gpu"})
    if alice_alive:
        assert r.status_code == 409, r.text
    else:
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready("carol")
    held = held_devices(hub, docker_client)
    assert len(held) == len(set(held)) == 2


async def test_container_removed_behind_the_hubs_back_is_freed(nvml_hub, docker_client):
    hub = await nvml_hub(
        gpus(1),
        extra_config="c.GPUPool.reconcile_interval = 1\n"
        "c.JupyterHub.last_activity_interval = 3600\n"
        "c.GPUDockerSpawner.poll_interval = 3600\n",
    )
    await hub.create_user("alice")
    await hub.create_user("bob")
    await spawn_ready(hub, "alice")
    assert await gauge(hub, "free") == 0
    [container] = hub.containers(docker_client)
    docker_client.remove_container(container["Id"], force=True)
    for _ in range(50):  # within a few reconciliation intervals
        if await gauge(hub, "free") == 1:
            break
        await asyncio.sleep(0.2)
    assert await gauge(hub, "free") == 1
    assert "its container is gone" in hub.log()


async def test_gpu_used_outside_the_hub_is_skipped(nvml_hub, docker_client):
    busy = {0: {"processes": [{"pid": 31337, "used_memory_mib": 2048}], "utilization_gpu": 97}}
    hub = await nvml_hub(gpus(2, busy))
    for user in ("alice", "bob"):
        await hub.create_user(user)
    await spawn_ready(hub, "alice")
    assert held_devices(hub, docker_client) == ["GPU-11111111-2222-3333-4444-000000000001"]
    r = await hub.spawn("bob", {"profile": "gpu"})
    assert r.status_code == 409, r.text
    assert await gauge(hub, "outside") == 1

    # gpuhub gpus shows who holds what, and the process outside the hub
    out = subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "gpus"],
        capture_output=True,
        text=True,
        env={**hub.env},
        check=True,
    ).stdout
    assert "outside the hub: pid 31337" in out
    assert re.search(r"GPU-11111111-2222-3333-4444-000000000001\s+held .* alice \(gpu", out)
