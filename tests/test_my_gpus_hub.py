"""``GET /hub/api/gpuhub/gpus/mine`` in a real hub: a server's own token reads the GPU it
holds, with the simulated inventory's figures, and not those of the member's other
servers; another member's server token reads nothing of hers; her own token reads all of
hers (:mod:`hub_ext.ops.my_gpus`).  Which GPU kernels count as a server's is
:func:`hub_ext.ops.my_gpus.held_servers`, tested in ``tests/test_my_gpus.py`` (a hub
starts a GPU kernel only once the kernels' API is in: then through it, here too)."""

from __future__ import annotations

import json

import pytest

from hub_ext.ops.my_gpus import MINE_SCOPE

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
]
#: another server of alice's, not a GPU kernel of her default server
OTHER = "second"


def node(n: int) -> dict:
    """A simulated node of ``n`` GPUs, each with its own figures (the demo's stand-in)."""
    return {
        "devices": [
            {
                "uuid": f"GPU-aaaaaaaa-0000-4000-8000-{i:012d}",
                "name": "Simulated A100",
                "memory_total_mib": 40960,
                "memory_used_mib": 1000 * (i + 1),
                "utilization_gpu": 10 * (i + 1),
            }
            for i in range(n)
        ]
    }


def server_token(hub, docker_client, user: str, server: str = "") -> str:
    """The token JupyterHub gave ``user``'s server (``JUPYTERHUB_API_TOKEN`` of its
    container), and the device it holds."""
    for c in hub.containers(docker_client):
        labels = c["Labels"]
        if labels.get("io.gpuhub.user") == user and labels.get("io.gpuhub.server", "") == server:
            env = docker_client.inspect_container(c["Id"])["Config"]["Env"]
            return dict(e.split("=", 1) for e in env)["JUPYTERHUB_API_TOKEN"]
    raise AssertionError(f"no container for {user}/{server}")


def device_of(hub, docker_client, user: str, server: str = "") -> str:
    for c in hub.containers(docker_client):
        labels = c["Labels"]
        if labels.get("io.gpuhub.user") == user and labels.get("io.gpuhub.server", "") == server:
            return labels["io.gpuhub.devices"]
    raise AssertionError(f"no container for {user}/{server}")


async def mine(hub, token: str) -> list[dict]:
    r = await hub.api("GET", "/gpuhub/gpus/mine", token=token)
    assert r.status_code == 200, r.text
    assert r.headers["Cache-Control"] == "no-store"
    return sorted(r.json()["gpus"], key=lambda g: g["held_by"])


@pytest.fixture
async def three_gpu_hub(hub_factory, tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps(node(3)))
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(PROFILES))
    return await hub_factory(GPUHUB_GPUS=f"simulated:{gpus}", GPUHUB_PROFILES=str(profiles))


async def start(hub, user: str, options: dict, server: str = "") -> None:
    r = await hub.spawn(user, options, server=server)
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(user, server)


async def test_a_server_reads_its_own_gpu_and_no_other_servers(three_gpu_hub, docker_client):
    hub = three_gpu_hub
    alice = await hub.create_user("alice")
    await hub.create_user("bob")
    await start(hub, "alice", {"profile": "gpu"})
    await start(hub, "alice", {"profile": "gpu"}, server=OTHER)
    await start(hub, "bob", {"profile": "gpu"})
    figures = {d["uuid"]: d for d in node(3)["devices"]}
    hers = device_of(hub, docker_client, "alice")
    other = device_of(hub, docker_client, "alice", OTHER)
    his = device_of(hub, docker_client, "bob")

    # her server's own token: its GPU, with the stand-in's figures
    rows = await mine(hub, server_token(hub, docker_client, "alice"))
    assert rows == [
        {
            "uuid": hers,
            "name": "Simulated A100",
            "held_by": "",
            "utilization_pct": figures[hers]["utilization_gpu"],
            "memory_used_mib": figures[hers]["memory_used_mib"],
            "memory_total_mib": 40960,
            "simulated": True,
        }
    ]
    # her other server's token: only its own GPU
    rows = await mine(hub, server_token(hub, docker_client, "alice", OTHER))
    assert [(r["uuid"], r["held_by"]) for r in rows] == [(other, OTHER)]
    # bob's server token: his GPU, nothing of hers
    rows = await mine(hub, server_token(hub, docker_client, "bob"))
    assert [r["uuid"] for r in rows] == [his]
    # her own API token: every server of hers
    assert {r["uuid"] for r in await mine(hub, alice)} == {hers, other}


async def test_a_token_without_the_scope_is_refused_in_words(three_gpu_hub):
    hub = three_gpu_hub
    await hub.create_user("alice")
    r = await hub.api("POST", "/users/alice/tokens", json={"scopes": ["read:users:name!user"]})
    assert r.status_code in (200, 201), r.text
    r = await hub.api("GET", "/gpuhub/gpus/mine", token=r.json()["token"])
    assert r.status_code == 403
    assert r.json()["message"] == "This token may not read the GPUs of its servers."
    # a member's own token holds the scope (the user role), filtered to her
    r = await hub.api("POST", "/users/alice/tokens", json={"note": "all"})
    r = await hub.api("GET", "/users/alice/tokens/" + r.json()["id"])
    assert f"{MINE_SCOPE}!user=alice" in r.json()["scopes"]
    r = await hub.api("GET", "/gpuhub/gpus/mine", token=None)  # the admin service: no servers
    assert r.status_code == 403
