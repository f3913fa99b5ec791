"""One member cannot exhaust the node (hub_ext/common/limits.py): every built-in profile has a
memory and CPU limit derived from the node, shown on its card, and JupyterHub's server
limits are set, each a GPUHUB_* setting."""

from __future__ import annotations

import json

import pytest

from hub_ext.common.limits import (
    GIB,
    MIB,
    Capacity,
    Node,
    Request,
    limited_profiles,
    limits_text,
    memory_text,
    misfit,
    node_gpu_count,
)
from hub_ext.config import DEFAULT_PROFILES
from hub_ext.jobs.hubconfig import NamedServerLimit
from tests.test_config import configure, spawner_reads

FOUR_GPU_NODE = Node(memory_bytes=160 * GIB, cpus=32.0, gpus=4)


def overrides(c, slug: str) -> dict:
    [profile] = [p for p in spawner_reads(c).profile_list if p["slug"] == slug]
    return profile["spawner_override"]


def test_a_gpu_share_is_the_nodes_memory_and_cpus_per_gpu_less_a_reserve():
    memory, cpus = FOUR_GPU_NODE.gpu_share()
    assert memory == int(160 * GIB * 0.9 / 4)  # 36 GiB
    assert cpus == 8.0


def test_the_cpu_profile_gets_a_quarter_share_but_at_least_one_cpu_and_one_gib():
    assert FOUR_GPU_NODE.cpu_profile_share() == (int(160 * GIB * 0.9 / 4) // 4, 2.0)
    small = Node(memory_bytes=2 * GIB, cpus=2.0, gpus=2)
    assert small.cpu_profile_share() == (GIB * 9 // 10, 1.0)  # never more than a share
    no_gpus = Node(memory_bytes=16 * GIB, cpus=4.0, gpus=0)
    assert no_gpus.gpu_share() == (int(16 * GIB * 0.9), 4.0)


def fill(node: Node) -> tuple[int, int, int, float]:
    """A node holding a GPU server on each GPU and as many CPU servers as fit beside them:
    (GPU servers, CPU servers, memory left in bytes, CPUs left)."""
    gpu_memory, gpu_cpus = node.gpu_share()
    cpu_memory, cpu_cpus = node.cpu_profile_share()
    memory = node.memory_bytes - node.gpus * gpu_memory
    cpus = node.cpus - node.gpus * gpu_cpus
    assert memory >= 0 and cpus >= 0, (node, memory, cpus)
    cpu_servers = int(min(memory // cpu_memory, cpus // cpu_cpus))
    return node.gpus, cpu_servers, memory - cpu_servers * cpu_memory, cpus


@pytest.mark.parametrize(
    "node, cpu_servers",
    [
        # the demo's Slurm nodes on a 2-core, 24 GiB machine: each claims half the memory,
        # and OverSubscribe=FORCE:2 lets two jobs share a core
        pytest.param(Node(12 * GIB, 2 * 2.0, 2, cpu_servers=2), 2, id="demo-node"),
        pytest.param(Node(515000 * MIB, 64.0, 8, cpu_servers=2), 2, id="eight-gpu-node"),
        # too small to keep room for two: one CPU server still fits
        pytest.param(Node(4096 * MIB, 4.0, 2, cpu_servers=2), 1, id="small-node"),
    ],
)
def test_where_slurm_allocates_a_full_gpu_node_still_takes_cpu_servers(node, cpu_servers):
    gpu_servers, cpus_servers, _, _ = fill(node)
    assert gpu_servers == node.gpus and cpus_servers >= cpu_servers
    assert node.gpu_share()[1] == int(node.gpu_share()[1]) >= 1  # whole CPUs for Slurm
    assert node.cpu_profile_share()[1] == int(node.cpu_profile_share()[1]) >= 1


def test_docker_limits_are_not_allocations_and_keep_no_room():
    assert FOUR_GPU_NODE.cpu_servers == 0
    assert FOUR_GPU_NODE.gpu_share() == (int(160 * GIB * 0.9 / 4), 8.0)


@pytest.mark.parametrize(
    "request_, words",
    [
        pytest.param(Request(2 * GIB, 1.0, 1), "", id="fits"),
        pytest.param(
            Request(10847 * MIB, 1.0, 1),
            "10.6 GB of memory (at most 8 GB on the nodes of partition gpu)",
            id="memory",
        ),
        pytest.param(
            Request(None, 8.0, 3),
            "3 GPUs (at most 2 on the nodes of partition gpu) and 8 CPUs (at most 4 on the "
            "nodes of partition gpu)",
            id="gpus-and-cpus",
        ),
        pytest.param(
            Request(None, None, 1, "a100"),
            "1 a100 GPUs (at most 0 on the nodes of partition gpu)",
            id="gres-type",
        ),
        pytest.param(
            Request(6 * GIB, None, 2),
            "6 GB of memory, 2 GPUs together (no single one of the nodes of partition gpu "
            "has them all)",
            id="not-on-one-node",
        ),
    ],
)
def test_misfit_names_what_no_node_has(request_, words):
    nodes = [
        Capacity("node1", 4 * GIB, 4.0, {"": 2}),
        Capacity("node2", 8 * GIB, 2.0, {"": 1}),
    ]
    assert misfit(request_, nodes, "the nodes of partition gpu") == words


def test_the_hub_runs_a_server_per_gib_at_least_four_per_gpu():
    assert Node(memory_bytes=16 * GIB, cpus=4.0, gpus=0).active_server_limit() == 14
    assert FOUR_GPU_NODE.active_server_limit() == 144
    assert Node(memory_bytes=8 * GIB, cpus=64.0, gpus=8).active_server_limit() == 32


def test_built_in_profiles_get_limits_and_a_sites_own_limits_are_kept():
    site = [
        {"slug": "big", "gpus": 2, "spawner_override": {"mem_limit": "64G"}},
        {"slug": "cpu", "spawner_override": {"cpu_limit": 0.5}},
    ]
    big, cpu = limited_profiles(site, FOUR_GPU_NODE)
    assert big["spawner_override"] == {"mem_limit": "64G", "cpu_limit": 16.0}
    assert cpu["spawner_override"] == {"cpu_limit": 0.5, "mem_limit": "9216M"}
    assert "mem_limit" not in site[0]["spawner_override"] or site[0]["spawner_override"] == {
        "mem_limit": "64G"
    }  # the input is not changed
    assert "cpu_limit" not in site[0]["spawner_override"]


def named_limit(c) -> int:
    """The named-server limit, which the jobs' configuration wraps in a callable that
    leaves a member's jobs out of JupyterHub's count (:class:`NamedServerLimit`)."""
    value = c.JupyterHub.named_server_limit_per_user
    assert isinstance(value, NamedServerLimit), value
    return value.limit


def test_a_fresh_install_limits_every_built_in_profile(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_GPUS="simulated:2")
    node = Node.probe(2)
    memory, cpus = node.gpu_share()
    assert overrides(c, "pytorch")["mem_limit"] == f"{memory // 1024**2}M"
    assert overrides(c, "pytorch")["cpu_limit"] == cpus
    cpu_memory, cpu_cpus = node.cpu_profile_share()
    assert overrides(c, "cpu")["mem_limit"] == f"{cpu_memory // 1024**2}M"
    assert overrides(c, "cpu")["cpu_limit"] == cpu_cpus
    assert all("mem_limit" not in p["spawner_override"] for p in DEFAULT_PROFILES)
    assert (
        named_limit(c),
        c.GPUDockerSpawner.active_server_limit,
        c.GPUDockerSpawner.concurrent_spawn_limit,
    ) == (1, node.active_server_limit(), 20)
    # JupyterHub's own two count places in line: the spawner applies them instead
    assert (c.JupyterHub.active_server_limit, c.JupyterHub.concurrent_spawn_limit) == (0, 0)


def test_a_sites_profile_file_is_used_as_written(tmp_path, monkeypatch):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps([{"slug": "cpu", "display_name": "CPU"}]))
    c = configure(tmp_path, monkeypatch, GPUHUB_PROFILES=str(path))
    assert "spawner_override" not in spawner_reads(c).profile_list[0]


def test_server_limits_are_settings(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_NAMED_SERVER_LIMIT="5",
        GPUHUB_ACTIVE_SERVER_LIMIT="0",
        GPUHUB_CONCURRENT_SPAWN_LIMIT="3",
    )
    assert (
        named_limit(c),
        c.GPUDockerSpawner.active_server_limit,
        c.GPUDockerSpawner.concurrent_spawn_limit,
    ) == (5, 0, 3)


def test_on_slurm_jupyterhub_applies_the_server_limits(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_BACKEND="slurm",
        GPUHUB_ACTIVE_SERVER_LIMIT="7",
        GPUHUB_CONCURRENT_SPAWN_LIMIT="3",
    )
    assert (c.JupyterHub.active_server_limit, c.JupyterHub.concurrent_spawn_limit) == (7, 3)


@pytest.mark.parametrize(
    "variable",
    ["GPUHUB_NAMED_SERVER_LIMIT", "GPUHUB_ACTIVE_SERVER_LIMIT", "GPUHUB_CONCURRENT_SPAWN_LIMIT"],
)
def test_a_negative_server_limit_names_the_variable(tmp_path, monkeypatch, variable):
    with pytest.raises(ValueError, match=f"{variable}=-1: use 0"):
        configure(tmp_path, monkeypatch, **{variable: "-1"})


def test_the_node_gpu_count_follows_gpuhub_gpus(tmp_path):
    doc = tmp_path / "node.json"
    doc.write_text(
        json.dumps({"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}, {"uuid": "GPU-c"}]})
    )
    assert node_gpu_count("simulated:6") == 6
    assert node_gpu_count(f"simulated:{doc}") == 3
    assert node_gpu_count("nvml") >= 0  # 0 where NVML finds no driver
    with pytest.raises(ValueError, match="cannot read the device list"):
        node_gpu_count(f"simulated:{tmp_path / 'missing.json'}")


@pytest.mark.parametrize(
    ("limit", "text"),
    [
        ("10847M", "10.6 GB"),
        ("16G", "16 GB"),
        ("512m", "512 MB"),
        (2 * GIB, "2 GB"),
        (None, ""),
        ("lots", ""),
    ],
)
def test_memory_limits_read_as_people_say_them(limit, text):
    assert memory_text(limit) == text


def test_a_cards_limits_sentence():
    assert limits_text("2711M", 1.0) == "Up to 1 CPU and 2.6 GB of memory"
    assert limits_text("16G", 2.5) == "Up to 2.5 CPUs and 16 GB of memory"
    assert limits_text(None, None) == ""


@pytest.mark.docker
@pytest.mark.hub
async def test_a_members_container_is_limited_and_the_card_says_so(hub_factory, docker_client):
    hub = await hub_factory()
    await hub.create_user("alice")
    r = await hub.spawn("alice", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    [container] = hub.containers(docker_client)
    host = docker_client.inspect_container(container["Id"])["HostConfig"]
    assert host["Memory"] > 0
    assert host["NanoCpus"] > 0
    assert host["PidsLimit"] == 4096 and host["ShmSize"] == 2 * GIB  # as before

    member = await hub.login("bob")
    page = (await member.get("/hub/spawn")).text
    assert page.count('class="gpuhub-limits">Up to ') == 2  # both built-in profiles
    assert " of memory</span>" in page


@pytest.mark.docker
@pytest.mark.hub
async def test_a_members_third_server_is_refused_in_a_sentence_by_default(hub_factory):
    # issue 13: one member ran three servers at once on the free profile; by default a
    # member has her default server and one named server, and the third is a 400
    hub = await hub_factory()
    token = await hub.create_user("alice")
    for server in ("", "first"):
        r = await hub.spawn("alice", {"profile": "cpu"}, server=server)
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready("alice", server)
    r = await hub.api("POST", "/users/alice/servers/second", token=token, json={"profile": "cpu"})
    assert r.status_code == 400
    assert r.json()["message"].startswith("User alice already has the maximum of 1 named servers.")
    assert await hub.stopped("alice", "second")
