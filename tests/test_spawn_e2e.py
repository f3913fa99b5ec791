"""The main job, end to end: real hub, real proxy, real containers on a simulated node.

A simulated two-GPU inventory stands in for NVML; everything else is real: the Docker
engine gets a GPU DeviceRequest for the exact UUIDs and the NVIDIA hook stand-in lets it
through, so the container sees NVIDIA_VISIBLE_DEVICES as on a GPU server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket

import pytest

from tests.fixtures.hub import terminal_run

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROBE = "echo GPUHUB:$NVIDIA_VISIBLE_DEVICES:$(id -u):END"
PROBE_RE = re.compile(r"GPUHUB:([^:\s]*):(\d+):END")


async def probe(hub, user, token) -> tuple[str, int]:
    out = await terminal_run(hub, user, token, PROBE, expect=":END")
    devices, uid = PROBE_RE.findall(out)[-1]
    return devices, int(uid)


def device_requests(docker_client, container_id) -> list:
    return docker_client.inspect_container(container_id)["HostConfig"]["DeviceRequests"] or []


PROFILES = """[
  {"display_name": "CPU only", "slug": "cpu", "default": true},
  {"display_name": "One GPU", "slug": "gpu", "gpus": 1}
]"""


@pytest.fixture
def two_profiles(tmp_path):
    path = tmp_path / "profiles.json"
    path.write_text(PROFILES)
    return str(path)


async def test_two_users_get_different_gpus_and_a_third_is_refused(
    hub_factory, docker_client, two_profiles
):
    hub = await hub_factory(GPUHUB_PROFILES=two_profiles)
    tokens = {u: await hub.create_user(u) for u in ("alice", "bob", "carol")}

    for user in ("alice", "bob"):
        r = await hub.spawn(user, {"profile": "gpu"})
        assert r.status_code in (201, 202), r.text
    for user in ("alice", "bob"):
        await hub.wait_ready(user)

    seen = {}
    for user in ("alice", "bob"):
        devices, uid = await probe(hub, user, tokens[user])
        assert devices.startswith("GPU-"), devices
        assert uid != 0
        seen[user] = devices
    assert seen["alice"] != seen["bob"]

    # the third GPU spawn is refused as the answer to its request (not a 202 and a
    # failure later: the refusal latency is measured by benchmarks/spawn_latency.py),
    # with the cause, and leaves nothing behind
    before = {c["Id"] for c in hub.containers(docker_client)}
    r = await hub.spawn("carol", {"profile": "gpu"})
    assert 400 <= r.status_code < 600, r.text
    assert "No GPU free" in r.json()["message"]
    assert {c["Id"] for c in hub.containers(docker_client)} == before

    # one stops; the third can start and gets the freed device
    await hub.stop_server("alice")
    r = await hub.spawn("carol", {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("carol")
    devices, _ = await probe(hub, "carol", tokens["carol"])
    assert devices == seen["alice"]


async def metric(hub, name: str, reason: str) -> float:
    """A counter of the hub's /hub/metrics, by reason (0 when never counted)."""
    r = await hub.client.get("/hub/metrics", headers={"Authorization": f"token {hub.admin_token}"})
    r.raise_for_status()
    m = re.search(rf'^{name}_total{{reason="{reason}"}} ([0-9.]+)$', r.text, re.M)
    return float(m.group(1)) if m else 0.0


async def test_named_servers_hold_gpus_of_their_own_within_the_members_limit(
    hub_factory, docker_client, two_profiles
):
    hub = await hub_factory(
        GPUHUB_PROFILES=two_profiles,
        GPUHUB_GPUS="simulated:3",
        GPUHUB_MAX_GPUS_PER_USER="2",
        GPUHUB_NAMED_SERVER_LIMIT="2",
    )
    await hub.create_user("alice")
    for server in ("", "train"):
        r = await hub.spawn("alice", {"profile": "gpu"}, server=server)
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready("alice", server)
    by_server = {c["Labels"]["io.gpuhub.server"]: c for c in hub.containers(docker_client)}
    assert sorted(by_server) == ["", "train"]
    assert by_server[""]["Names"] == [f"/{hub.id}-jupyter-alice"]
    assert by_server["train"]["Names"] == [f"/{hub.id}-jupyter-alice--train"]
    devices = {server: c["Labels"]["io.gpuhub.devices"] for server, c in by_server.items()}
    assert devices[""] != devices["train"]

    # a third GPU server is past her limit, with one GPU still free: refused, and counted
    r = await hub.spawn("alice", {"profile": "gpu"}, server="more")
    assert r.status_code == 409, r.text
    assert "each member may hold 2" in r.json()["message"]
    assert await metric(hub, "gpuhub_gpu_allocations_refused", "user_limit") == 1
    assert await metric(hub, "gpuhub_spawns_refused", "user_limit") == 1
    # ...while a CPU server is not limited
    r = await hub.spawn("alice", {"profile": "cpu"}, server="more")
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice", "more")


async def test_cpu_profile_has_no_device_request(hub_factory, docker_client, two_profiles):
    hub = await hub_factory(GPUHUB_PROFILES=two_profiles)
    token = await hub.create_user("dave")
    r = await hub.spawn("dave", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("dave")
    [container] = hub.containers(docker_client)
    assert device_requests(docker_client, container["Id"]) == []
    devices, uid = await probe(hub, "dave", token)
    assert devices == "void"  # even a runtime that defaults to all GPUs shows none
    assert uid != 0


async def test_new_files_in_the_workspace_are_the_members_alone(hub_factory, two_profiles):
    # GPUDockerSpawner.umask: 077 for the server, its terminals and what JupyterLab saves
    hub = await hub_factory(GPUHUB_PROFILES=two_profiles)
    token = await hub.create_user("erin")
    r = await hub.spawn("erin", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("erin")
    r = await hub.client.put(
        "/user/erin/api/contents/work/saved.txt",
        headers={"Authorization": f"token {token}"},
        json={"type": "file", "format": "text", "content": "hers"},
    )
    assert r.status_code == 201, r.text
    out = await terminal_run(
        hub,
        "erin",
        token,
        "touch work/new; echo MODES:$(stat -c %a work/new work/saved.txt):END",
        expect=":END",
    )
    assert re.findall(r"MODES:(\d+) (\d+):END", out)[-1] == ("600", "600"), out


async def test_gpu_container_requests_exactly_its_device(hub_factory, docker_client, two_profiles):
    hub = await hub_factory(GPUHUB_PROFILES=two_profiles)
    await hub.create_user("erin")
    r = await hub.spawn("erin", {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("erin")
    [container] = hub.containers(docker_client)
    [request] = device_requests(docker_client, container["Id"])
    assert request["Driver"] == "nvidia"
    assert request["Capabilities"] == [["gpu"]]
    assert request["DeviceIDs"] == [container["Labels"]["io.gpuhub.devices"]]
    assert container["Labels"]["io.gpuhub.user"] == "erin"


async def test_lab_is_served_through_the_proxy_and_only_to_its_owner(hub_factory, two_profiles):
    hub = await hub_factory(GPUHUB_PROFILES=two_profiles)
    alice = await hub.create_user("alice")
    mallory = await hub.create_user("mallory")
    r = await hub.spawn("alice", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")

    r = await hub.client.get("/user/alice/lab", headers={"Authorization": f"token {alice}"})
    assert r.status_code == 200
    assert "JupyterLab" in r.text

    r = await hub.client.get("/user/alice/lab", headers={"Authorization": f"token {mallory}"})
    assert r.status_code == 403 or (r.status_code == 302 and "login" in r.headers["location"])
    assert "JupyterLab" not in r.text
    r = await hub.client.get("/user/alice/api/contents")  # no credentials at all
    assert r.status_code in (302, 401, 403)


async def test_bad_image_returns_the_gpu_to_the_pool(hub_factory, docker_client, tmp_path):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        '[{"display_name": "Broken", "slug": "broken", "gpus": 1,'
        ' "spawner_override": {"image": "gpuhub/no-such-image:latest"}},'
        ' {"display_name": "GPU", "slug": "gpu", "gpus": 2}]'
    )
    hub = await hub_factory(GPUHUB_PROFILES=str(profiles))
    await hub.create_user("frank")
    r = await hub.spawn("frank", {"profile": "broken"})
    assert r.status_code >= 400, r.text
    assert "not on this node" in r.json()["message"]
    assert hub.containers(docker_client) == []
    # both GPUs are free again: a two-GPU spawn works
    r = await hub.spawn("frank", {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("frank")


async def test_container_that_dies_at_start_returns_the_gpu(hub_factory, docker_client, tmp_path):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        '[{"display_name": "Dies", "slug": "dies", "gpus": 2,'
        ' "spawner_override": {"cmd": ["false"]}},'
        ' {"display_name": "GPU", "slug": "gpu", "gpus": 2}]'
    )
    hub = await hub_factory(GPUHUB_PROFILES=str(profiles))
    await hub.create_user("gina")
    r = await hub.spawn("gina", {"profile": "dies"})
    if r.status_code in (201, 202):  # the failure may come after the POST returned
        with pytest.raises(AssertionError):
            await hub.wait_ready("gina")
    else:
        assert "stopped while starting" in r.json()["message"]
    assert hub.containers(docker_client) == []
    r = await hub.spawn("gina", {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("gina")


async def test_stop_during_spawn_returns_the_gpu(hub_factory, docker_client, tmp_path):
    # a server that never answers keeps the spawn pending until we stop it
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        '[{"display_name": "Slow", "slug": "slow", "gpus": 2,'
        ' "spawner_override": {"cmd": ["sh", "-c", "sleep 600", "--"]}},'
        ' {"display_name": "GPU", "slug": "gpu", "gpus": 2}]'
    )
    hub = await hub_factory(GPUHUB_PROFILES=str(profiles))
    await hub.create_user("hank")
    r = await hub.spawn("hank", {"profile": "slow"})
    assert r.status_code == 202, r.text
    for _ in range(100):
        if hub.containers(docker_client):
            break
        await asyncio.sleep(0.1)
    assert hub.containers(docker_client), "the container was never created"
    await hub.stop_server("hank")
    for _ in range(50):
        if not hub.containers(docker_client):
            break
        await asyncio.sleep(0.2)
    assert hub.containers(docker_client) == []
    r = await hub.spawn("hank", {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("hank")


# Two hooks: the first is done at once and its undo (the clean-up of a cancelled start)
# takes 3 s, as a refund through a slow Credits API or a slow container removal does under
# load; the second holds every start until it is cancelled (defined in the hub's config
# file: the hub imports hub_ext only)
SLOW_UNDO = """
import asyncio
from traitlets.config import SingletonConfigurable

from hub_ext.spawn.hooks import Hook

class SlowUndo(Hook, SingletonConfigurable):
    name = "slow-undo"

    async def before_container(self, spawner):
        pass

    async def undo(self, spawner):
        await asyncio.sleep(3)
        spawner.log.info("Undone the start of %s", spawner._log_name)

class Hold(Hook, SingletonConfigurable):
    name = "hold"

    async def before_container(self, spawner):
        spawner.log.info("Holding the start of %s", spawner._log_name)
        await asyncio.sleep(600)

    async def undo(self, spawner):
        pass

c.GPUDockerSpawner.before_container_hooks.extend([SlowUndo.instance(), Hold.instance()])
"""


async def test_stop_while_starting_waits_for_the_start_to_clean_up(hub_factory):
    # JupyterHub cancels the start, waits 1 s, and answered 500 ("pending spawn") when the
    # start's clean-up took longer; the member's Stop is answered once it is done
    hub = await hub_factory(extra_config=SLOW_UNDO)
    await hub.create_user("hal")
    r = await hub.spawn("hal", {"profile": "cpu"})
    assert r.status_code == 202, r.text
    assert "Holding the start of hal" in hub.log()
    await hub.stop_server("hal")  # asserts 202 or 204
    assert "Undone the start of hal" in hub.log()
    assert "hal pending spawn" not in hub.log()  # stop_single_user's RuntimeError


# A server that takes TCP connections on its port but never answers HTTP on them.
SILENT_SERVER = (
    "import os, socket, time, urllib.parse; "
    "port = urllib.parse.urlparse(os.environ['JUPYTERHUB_SERVICE_URL']).port; "
    "s = socket.socket(); s.bind(('127.0.0.1', port)); s.listen(); time.sleep(600)"
)


async def test_an_open_port_alone_is_not_taken_for_a_started_server(
    hub_factory, docker_client, tmp_path
):
    # the readiness check looks at the port first, but only an HTTP answer means "up"
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        json.dumps(
            [
                {
                    "display_name": "Silent",
                    "slug": "silent",
                    "spawner_override": {"cmd": ["python", "-c", SILENT_SERVER]},
                }
            ]
        )
    )
    # host networking: the server's port is on this machine's loopback (its label)
    hub = await hub_factory(GPUHUB_PROFILES=str(profiles), GPUHUB_DOCKER_NETWORK="host")
    await hub.create_user("ivan")
    r = await hub.spawn("ivan", {"profile": "silent"})
    assert r.status_code == 202, r.text
    port = None
    for _ in range(100):
        found = hub.containers(docker_client)
        if found:
            port = int(found[0]["Labels"]["io.gpuhub.port"])
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                pass
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the silent server's port never opened")
    # many port checks later, the spawn still waits for an HTTP answer
    messages = []
    headers = {"Authorization": f"token {hub.admin_token}"}
    async with hub.client.stream(
        "GET", "/hub/api/users/ivan/server/progress", headers=headers
    ) as stream:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3):
                async for line in stream.aiter_lines():
                    if line.startswith("data:"):
                        messages.append(json.loads(line[5:]).get("message", ""))
    assert "Waiting for JupyterLab to answer" in messages
    assert not any("up" in m.split() or "ready" in m.split() for m in messages), messages
    model = (await hub.client.get("/hub/api/users/ivan", headers=headers)).json()
    assert model["servers"][""]["pending"] == "spawn", model
    # (the hub's own clean-up ends the pending start and removes the container)
