"""A member's server container as a value (hub_ext.docker.container.make_container): what
Docker is asked to create, from the profile, the member and the allocation, without Docker."""

from __future__ import annotations

import pytest

from hub_ext.docker.container import make_container


def spec(**given):
    base = dict(
        name="jupyter-alice",
        image="gpuhub/pytorch:latest",
        command=["jupyterhub-singleuser", "--KernelManager.transport=ipc"],
        environment={"JUPYTERHUB_USER": "alice"},
        binds={},
        port=8888,
        labels={"io.gpuhub.user": "alice"},
        workspace="jupyterhub-user-alice",
        workspace_mount="/home/jovyan/work",
    )
    return make_container(**{**base, **given})


def test_a_gpu_server_gets_exactly_its_devices_and_no_more():
    gpu = spec(devices=("GPU-1", "GPU-2"))
    assert gpu.host["device_requests"] == [
        {"Driver": "nvidia", "DeviceIDs": ["GPU-1", "GPU-2"], "Capabilities": [["gpu"]]}
    ]
    assert "NVIDIA_VISIBLE_DEVICES" not in gpu.create["environment"]
    cpu = spec(extra_host_config={"device_requests": [{"Driver": "nvidia"}]})
    assert "device_requests" not in cpu.host  # a profile's own request is dropped
    assert cpu.create["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_the_workspace_and_the_datasets_are_mounted_the_datasets_read_only():
    s = spec(
        binds={"/srv/shared": {"bind": "/shared", "mode": "ro"}},
        datasets={"mnist": "/data/mnist", "imagenet": "/data/in"},
    )
    assert s.host["binds"] == {
        "/srv/shared": {"bind": "/shared", "mode": "ro"},
        "jupyterhub-user-alice": {"bind": "/home/jovyan/work", "mode": "rw"},
    }
    assert s.create["volumes"] == ["/home/jovyan/work", "/shared"]
    assert s.host["mounts"] == [
        {"Type": "bind", "Source": "/data/in", "Target": "/datasets/imagenet", "ReadOnly": True},
        {"Type": "bind", "Source": "/data/mnist", "Target": "/datasets/mnist", "ReadOnly": True},
    ]


def test_the_member_runs_as_their_own_uid_with_a_home():
    s = spec(ids=(1234, 1234))
    assert s.create["user"] == "1234:1234"
    assert s.create["environment"]["HOME"] == "/home/jovyan"
    assert "user" not in spec().create  # the image's jovyan


@pytest.mark.parametrize(
    ("cpu_limit", "expected"),
    [
        pytest.param(1.5, {"nano_cpus": 1_500_000_000, "cpu_period": 0, "cpu_quota": 0}, id="cpus"),
        pytest.param(None, {}, id="none"),
    ],
)
def test_limits_and_security_options(cpu_limit, expected):
    s = spec(mem_limit=2 * 2**30, cpu_limit=cpu_limit, pids_limit=512, shm_size="8g")
    assert {k: s.host[k] for k in ("nano_cpus", "cpu_period", "cpu_quota") if k in s.host} == (
        expected
    )
    assert (s.host["mem_limit"], s.host["pids_limit"], s.host["shm_size"]) == (2**31, 512, "8g")
    assert s.host["security_opt"] == ["no-new-privileges"]
    assert s.host["cap_drop"] == ["ALL"]
    assert s.host["auto_remove"] is False  # its logs outlive a failed start
    assert s.host["log_config"]["Config"]["max-size"] == "50m"


def test_a_profiles_own_docker_options_are_merged_under_the_hubs():
    s = spec(
        extra_create_kwargs={"labels": {"site": "x"}, "hostname": "lab"},
        extra_host_config={"shm_size": "16g", "auto_remove": True, "cap_drop": []},
    )
    assert s.create["labels"] == {"site": "x", "io.gpuhub.user": "alice"}
    assert s.create["hostname"] == "lab"
    assert s.host["shm_size"] == "16g"  # the profile's size wins
    assert s.host["auto_remove"] is False  # the hub's clean-up wins
    assert s.host["cap_drop"] == []


def test_the_umask_wraps_the_servers_command():
    s = spec(umask="077")
    assert s.create["command"] == [
        "sh",
        "-c",
        'umask 077 && exec "$@"',
        "sh",
        "jupyterhub-singleuser",
        "--KernelManager.transport=ipc",
    ]
    assert spec().create["command"][0] == "jupyterhub-singleuser"


def test_host_networking_or_a_bridge_network():
    bridge = spec(network_name="gpuhub")
    assert bridge.host["network_mode"] == "gpuhub"
    assert "port_bindings" not in bridge.host
    published = spec(use_internal_ip=False, host_ip="127.0.0.1")
    assert published.host["port_bindings"] == {8888: ("127.0.0.1",)}
    assert spec().create["ports"] == {"8888/tcp": None}
