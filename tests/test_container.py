"""The container a member lives in: workspace, datasets, their own uid, limits (real Docker)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {
        "display_name": "GPU",
        "slug": "gpu",
        "gpus": 1,
        "spawner_override": {"mem_limit": "2G", "cpu_limit": 1.5, "pids_limit": 512},
    },
]


@pytest.fixture
def site(tmp_path):
    """A site's files: profiles, two datasets (one for a group), a uid mapping."""
    (tmp_path / "profiles.json").write_text(json.dumps(PROFILES))
    for name in ("mnist", "imagenet"):
        (tmp_path / "datasets" / name).mkdir(parents=True)
        (tmp_path / "datasets" / name / "README").write_text(f"{name}\n")
    (tmp_path / "uids.json").write_text(json.dumps({"alice": {"uid": 1234, "gid": 1234}}))
    return tmp_path


def config(site, **extra) -> str:
    datasets = {
        "mnist": {"path": str(site / "datasets" / "mnist")},
        "imagenet": {"path": str(site / "datasets" / "imagenet"), "groups": ["vision"]},
        **extra.pop("datasets", {}),
    }
    lines = [
        f"c.GPUDockerSpawner.datasets = {datasets!r}",
        f"c.GPUDockerSpawner.uid_map_file = {str(site / 'uids.json')!r}",
    ]
    lines += [f"c.GPUDockerSpawner.{k} = {v!r}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def exec_in(docker_client, container_id, *cmd) -> tuple[int, str]:
    run = docker_client.exec_create(container_id, list(cmd))
    out = docker_client.exec_start(run["Id"]).decode()
    return docker_client.exec_inspect(run["Id"])["ExitCode"], out


async def started(hub, docker_client, user, profile="cpu"):
    r = await hub.spawn(user, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(user)
    [c] = [c for c in hub.containers(docker_client) if c["Labels"]["io.gpuhub.user"] == user]
    return c["Id"]


async def test_workspace_survives_stop_profile_change_and_hub_restart(
    hub_factory, docker_client, site
):
    hub = await hub_factory(extra_config=config(site), GPUHUB_PROFILES=str(site / "profiles.json"))
    await hub.create_user("bob")
    cid = await started(hub, docker_client, "bob", "cpu")
    code, _ = exec_in(docker_client, cid, "sh", "-c", "echo kept > ~/work/notes.txt")
    assert code == 0
    await hub.stop_server("bob")
    cid = await started(hub, docker_client, "bob", "gpu")
    assert exec_in(docker_client, cid, "cat", "/home/jovyan/work/notes.txt") == (0, "kept\n")
    await hub.restart(signal.SIGKILL)
    await hub.stop_server("bob")  # a new container after the restart, the same workspace
    cid = await started(hub, docker_client, "bob", "cpu")
    assert exec_in(docker_client, cid, "cat", "/home/jovyan/work/notes.txt") == (0, "kept\n")


async def test_host_path_workspace_lives_under_its_root_owned_by_the_member(
    hub_factory, docker_client, site
):
    root = site / "home"
    root.mkdir()
    hub = await hub_factory(
        extra_config=config(site),
        GPUHUB_PROFILES=str(site / "profiles.json"),
        GPUHUB_WORKSPACE=str(root / "{username}"),
        GPUHUB_WORKSPACE_ROOT=str(root),
    )
    await hub.create_user("alice")
    cid = await started(hub, docker_client, "alice")
    assert exec_in(docker_client, cid, "sh", "-c", "echo mine > ~/work/notes.txt")[0] == 0
    await hub.stop_server("alice")
    assert (root / "alice" / "notes.txt").read_text() == "mine\n"
    st = (root / "alice").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1234, 1234, 0o700)


async def test_host_path_workspace_outside_its_root_is_refused_and_creates_nothing(
    hub_factory, docker_client, site
):
    root = site / "home"
    hub = await hub_factory(
        extra_config=config(site, workspace="/srv/elsewhere/{username}"),
        GPUHUB_PROFILES=str(site / "profiles.json"),
        GPUHUB_WORKSPACE=str(root / "{username}"),
        GPUHUB_WORKSPACE_ROOT=str(root),
    )
    await hub.create_user("bob")
    r = await hub.spawn("bob", {"profile": "gpu"})
    assert r.status_code == 500, r.text
    assert "workspace is not configured correctly" in r.json()["message"]
    assert not root.exists() and not Path("/srv/elsewhere").exists()
    assert hub.containers(docker_client) == []


async def test_datasets_are_read_only_and_per_group(hub_factory, docker_client, site):
    hub = await hub_factory(extra_config=config(site), GPUHUB_PROFILES=str(site / "profiles.json"))
    await hub.create_user("bob")
    cid = await started(hub, docker_client, "bob")
    assert exec_in(docker_client, cid, "cat", "/datasets/mnist/README") == (0, "mnist\n")
    code, out = exec_in(docker_client, cid, "touch", "/datasets/mnist/new")
    assert code != 0 and "Read-only file system" in out
    assert exec_in(docker_client, cid, "test", "-e", "/datasets/imagenet")[0] != 0  # not his group
    assert not (site / "datasets" / "mnist" / "new").exists()


async def test_group_member_gets_the_groups_dataset(hub_factory, docker_client, site):
    hub = await hub_factory(extra_config=config(site), GPUHUB_PROFILES=str(site / "profiles.json"))
    await hub.create_user("vera")
    r = await hub.api("POST", "/groups/vision", json={"users": ["vera"]})
    assert r.status_code == 201, r.text
    cid = await started(hub, docker_client, "vera")
    assert exec_in(docker_client, cid, "cat", "/datasets/imagenet/README") == (0, "imagenet\n")


async def test_only_the_members_own_workspace_is_mounted(hub_factory, docker_client, site):
    hub = await hub_factory(extra_config=config(site), GPUHUB_PROFILES=str(site / "profiles.json"))
    for user in ("bob", "carol"):
        await hub.create_user(user)
        await started(hub, docker_client, user)
    for c in hub.containers(docker_client):
        user = c["Labels"]["io.gpuhub.user"]
        sources = {
            m.get("Name") or m["Source"] for m in docker_client.inspect_container(c["Id"])["Mounts"]
        }
        workspaces = {s for s in sources if "-user-" in s}
        assert workspaces == {hub.workspace(user)}


async def test_uid_is_what_the_mapping_says(hub_factory, docker_client, site):
    hub = await hub_factory(extra_config=config(site), GPUHUB_PROFILES=str(site / "profiles.json"))
    await hub.create_user("alice")
    await hub.create_user("bob")
    alice = await started(hub, docker_client, "alice")
    bob = await started(hub, docker_client, "bob")
    assert exec_in(docker_client, alice, "id", "-u")[1].strip() == "1234"
    assert exec_in(docker_client, bob, "id", "-u")[1].strip() == "1000"
    # her workspace is hers: she can write in it
    assert exec_in(docker_client, alice, "touch", "/home/jovyan/work/mine")[0] == 0


async def test_limits_and_security_options_reach_docker(hub_factory, docker_client, site):
    hub = await hub_factory(extra_config=config(site), GPUHUB_PROFILES=str(site / "profiles.json"))
    await hub.create_user("bob")
    cid = await started(hub, docker_client, "bob", "gpu")
    host = docker_client.inspect_container(cid)["HostConfig"]
    assert host["Memory"] == 2 * 1024**3
    # docker run --cpus 1.5: NanoCpus, not DockerSpawner's CFS quota
    assert host["NanoCpus"] == 1_500_000_000
    assert host["CpuQuota"] == 0 and host["CpuPeriod"] == 0
    assert host["PidsLimit"] == 512
    assert host["ShmSize"] == 2 * 1024**3
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["CapDrop"] == ["ALL"]
    assert host["LogConfig"] == {
        "Type": "json-file",
        "Config": {"max-file": "3", "max-size": "50m"},
    }
    assert host["AutoRemove"] is False  # stop() removes it, after a failed start too


async def test_missing_dataset_path_is_a_clear_error_and_creates_nothing(
    hub_factory, docker_client, site
):
    missing = site / "datasets" / "coco"
    hub = await hub_factory(
        extra_config=config(site, datasets={"coco": {"path": str(missing)}}),
        GPUHUB_PROFILES=str(site / "profiles.json"),
    )
    await hub.create_user("bob")
    r = await hub.spawn("bob", {"profile": "gpu"})
    assert r.status_code == 500, r.text
    assert "The dataset 'coco' is not available" in r.json()["message"]
    assert not missing.exists()
    assert hub.containers(docker_client) == []
    assert not docker_client.volumes(filters={"name": hub.workspace("bob")})["Volumes"]


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param({"gid": 1234}, id="no-uid"),
        pytest.param({"uid": "alice"}, id="not-a-number"),
        pytest.param({"uid": 0}, id="root"),
        pytest.param({"uid": 1234, "gid": 0}, id="root-group"),
    ],
)
async def test_bad_uid_mapping_is_a_clear_error_and_creates_nothing(
    hub_factory, docker_client, site, entry
):
    (site / "uids.json").write_text(json.dumps({"bob": entry}))
    hub = await hub_factory(extra_config=config(site), GPUHUB_PROFILES=str(site / "profiles.json"))
    await hub.create_user("bob")
    r = await hub.spawn("bob", {"profile": "gpu"})
    assert r.status_code == 403, r.text
    assert "not a valid non-root uid and gid" in r.json()["message"]
    assert hub.containers(docker_client) == []
    assert not docker_client.volumes(filters={"name": hub.workspace("bob")})["Volumes"]


async def test_uid_and_gid_can_come_from_the_login_service(hub_factory, docker_client, site):
    hub = await hub_factory(
        GPUHUB_PROFILES=str(site / "profiles.json"),
        GPUHUB_OIDC_UID_CLAIM="uidNumber",
        GPUHUB_OIDC_GID_CLAIM="gidNumber",
    )
    browser = await hub.login("carol", uidNumber=4242, gidNumber=4343)
    r = await hub.browser_api(browser, "POST", "/users/carol/server", json={"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("carol")
    [c] = hub.containers(docker_client)
    assert exec_in(docker_client, c["Id"], "id", "-u")[1].strip() == "4242"
    assert exec_in(docker_client, c["Id"], "id", "-g")[1].strip() == "4343"


async def test_unknown_uid_mapping_is_a_clear_error_and_creates_nothing(
    hub_factory, docker_client, site
):
    hub = await hub_factory(
        extra_config=config(site, require_uid_mapping=True),
        GPUHUB_PROFILES=str(site / "profiles.json"),
    )
    await hub.create_user("bob")
    r = await hub.spawn("bob", {"profile": "gpu"})
    assert r.status_code == 403, r.text
    assert "No uid is mapped for bob" in r.json()["message"]
    assert hub.containers(docker_client) == []
    assert not docker_client.volumes(filters={"name": hub.workspace("bob")})["Volumes"]
    # and the GPU it would have used is free: alice (mapped) gets it
    await hub.create_user("alice")
    await started(hub, docker_client, "alice", "gpu")
