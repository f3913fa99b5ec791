"""GPU kernels without a hub: what a new kernel must pass (hub_ext.kernels.checks), the table
(hub_ext.kernels.store), the profile key, the spawner's wiring, the ledger's words, the
named-server limit and the culler's arbiter.  The same through a real hub, with the
images' provisioner and gpuhub-kernel: tests/test_gpu_kernels_hub.py."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from hub_ext.common.runs import kind
from hub_ext.credits.metering import MeterRecord
from hub_ext.culling.arbiter import ProfileIdleLimits
from hub_ext.kernels import store
from hub_ext.kernels.checks import (
    KernelRefused,
    check_connection_dir,
    kernel_profile,
    read_request,
)
from hub_ext.kernels.handlers import display_name
from hub_ext.spawn.profiles import ProfileError, init_profiles, kernels_allowed

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4, "kernels": True},
    {"display_name": "No kernels", "slug": "jobsonly", "gpus": 1},
    {
        "display_name": "Course GPU",
        "slug": "course",
        "gpus": 1,
        "kernels": True,
        "allowed_groups": ["ml101"],
    },
]
GOOD = {
    "profile": "gpu",
    "notebook": "course/train.ipynb",
    "cwd": "course",
    "connection_dir": ".gpuhub/kernels/0f6c1d54-3b8e-4b1a-9c3e-1f2e3d4c5b6a",
}


def refused(call, *args) -> tuple[int, str]:
    with pytest.raises(KernelRefused) as e:
        call(*args)
    return e.value.status, e.value.message


def test_a_good_request_is_read_with_its_paths_made_plain():
    request = read_request({**GOOD, "cwd": "./course/", "user": "alice", "parent": ""}, "alice", "")
    assert (request.profile, request.notebook, request.cwd) == (
        "gpu",
        "course/train.ipynb",
        "course",
    )
    assert request.connection_dir == GOOD["connection_dir"]
    assert read_request({**GOOD, "cwd": ""}, "alice", "").cwd == ""


@pytest.mark.parametrize(
    "body, status, words",
    [
        pytest.param([], 400, "JSON object", id="not-an-object"),
        pytest.param({**GOOD, "gpus": 8}, 400, "Unexpected field(s) 'gpus'", id="more-gpus-asked"),
        pytest.param({**GOOD, "profile": ""}, 400, "profile is missing", id="no-profile"),
        pytest.param({**GOOD, "profile": {"slug": "gpu"}}, 400, "must be a string", id="nested"),
        pytest.param({**GOOD, "notebook": ["a"] * 3}, 400, "must be a string", id="list"),
        pytest.param({**GOOD, "cwd": "x" * 2000}, 400, "at most 1024", id="long"),
        pytest.param({**GOOD, "cwd": "../bob"}, 400, "leaves your workspace", id="cwd-up"),
        pytest.param({**GOOD, "notebook": "/etc/passwd"}, 400, "relative", id="absolute"),
        pytest.param({**GOOD, "notebook": "a\x00b"}, 400, "NUL", id="nul"),
        pytest.param(
            {**GOOD, "connection_dir": "work/k"}, 400, "under .gpuhub/kernels/", id="conn-elsewhere"
        ),
        pytest.param(
            {**GOOD, "connection_dir": ".gpuhub/kernels/a/b"},
            400,
            "a folder of its own",
            id="conn-deeper",
        ),
        pytest.param(
            {**GOOD, "connection_dir": ".gpuhub/kernels/../../x"},
            400,
            "leaves your workspace",
            id="conn-up",
        ),
        pytest.param({**GOOD, "user": "bob"}, 403, "not this request's", id="another-member"),
        pytest.param({**GOOD, "parent": "other"}, 403, "not this request's", id="another-server"),
    ],
)
def test_a_request_that_is_not_a_kernel_of_ones_own_is_refused_in_words(body, status, words):
    got_status, message = refused(read_request, body, "alice", "")
    assert (got_status, words in message) == (status, True), message


@pytest.mark.parametrize(
    "slug, status, words",
    [
        pytest.param("gpu-x", 404, "No such GPU kernel: 'gpu-x'. Options include: gpu.", id="none"),
        pytest.param("cpu", 404, "offers no GPU kernels. Options include: gpu.", id="cpu"),
        pytest.param("jobsonly", 404, "offers no GPU kernels", id="gpu-without-kernels"),
        pytest.param("course", 403, "not open to you", id="another-groups"),
    ],
)
def test_a_profile_must_exist_offer_kernels_and_be_open_to_the_member(slug, status, words):
    everything = init_profiles(PROFILES)
    visible = [p for p in everything if not p.get("allowed_groups")]
    assert kernel_profile(visible, everything, "gpu")["slug"] == "gpu"
    got_status, message = refused(kernel_profile, visible, everything, slug)
    assert (got_status, words in message) == (status, True), message


def test_gpu_kernels_are_offered_only_where_a_profile_says_so():
    profiles = {p["slug"]: p for p in init_profiles(PROFILES)}
    assert [s for s, p in profiles.items() if kernels_allowed(p)] == ["gpu", "course"]
    with pytest.raises(ProfileError, match="kernels must be true or false"):
        init_profiles([{"display_name": "X", "kernels": "yes"}])


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    (root / ".gpuhub" / "kernels" / "k1").mkdir(parents=True)
    (root / ".gpuhub" / "kernels" / "k1").chmod(0o700)
    return root


def test_the_connection_folder_must_be_the_members_alone(workspace, tmp_path):
    uid = os.getuid()
    check_connection_dir(str(workspace), ".gpuhub/kernels/k1", uid)
    assert refused(check_connection_dir, str(workspace), ".gpuhub/kernels/k2", uid)[0] == 400
    assert refused(check_connection_dir, str(workspace), ".gpuhub/kernels/k1", uid + 1)[0] == 403
    (workspace / ".gpuhub" / "kernels" / "k1").chmod(0o750)
    assert (
        "yours alone" in refused(check_connection_dir, str(workspace), ".gpuhub/kernels/k1", uid)[1]
    )
    # a link anywhere on the way, wherever it points
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    os.symlink(outside, workspace / ".gpuhub" / "kernels" / "k3")
    status, words = refused(check_connection_dir, str(workspace), ".gpuhub/kernels/k3", uid)
    assert (status, "link" in words) == (403, True)


def test_a_kernel_ends_once_and_ended_ones_are_forgotten_later(hub_db):
    row = store.insert(
        hub_db, user="alice", profile="gpu", parent="", connection_dir=".gpuhub/kernels/x"
    )
    assert row.server_name == f"kernel-{row.id}" and len(row.id) == 12
    assert store.by_server(hub_db, "alice", row.server_name).id == row.id
    assert store.count_live(hub_db, "alice") == 1
    assert store.set_running(hub_db, row, ["GPU-a"]) and row.gpus == ["GPU-a"]
    assert store.finish(hub_db, row, "shutdown", "You shut the GPU kernel down.")
    assert not store.finish(hub_db, row, "died", "second")  # ended once
    assert not store.set_running(hub_db, row, ["GPU-b"])
    assert (row.state, row.reason, row.gpus) == ("ended", "shutdown", ["GPU-a"])
    assert store.count_live(hub_db, "alice") == 0
    assert store.count_servers(hub_db, "alice", {row.server_name, "dev"}) == 1
    assert store.forget_ended(hub_db, row.ended - 1) == []
    assert store.forget_ended(hub_db, row.ended + 1) == [("alice", row.server_name)]
    assert store.get(hub_db, row.id) is None


@pytest.mark.parametrize(
    "name, gpus, price, listed",
    [
        pytest.param(
            "PyTorch", "1 GPU", 1, "Python 3 (PyTorch, 1 GPU, 1.00 credits/h)", id="plain"
        ),
        pytest.param(
            "PyTorch, 1 GPU", "1 GPU", 1, "Python 3 (PyTorch, 1 GPU, 1.00 credits/h)", id="shipped"
        ),
        pytest.param(
            "Two A100 GPUs", "2 GPUs", 8, "Python 3 (Two A100 GPUs, 8.00 credits/h)", id="in-words"
        ),
        pytest.param(
            "Course GPU", "1 GPU", 0, "Python 3 (Course GPU, 1 GPU, 0.00 credits/h)", id="no-count"
        ),
    ],
)
def test_a_gpu_kernel_is_listed_with_its_gpus_said_once(name, gpus, price, listed):
    assert display_name(name, gpus, price) == listed


def test_runs_are_told_apart_by_their_server_names():
    assert [kind(n) for n in ("", "dev", "job-0a1b2c", "kernel-0a1b2c3d4e5f")] == [
        "server",
        "server",
        "job",
        "kernel",
    ]


def test_the_ledger_names_a_gpu_kernel_and_its_notebook_and_a_replay_says_the_same():
    started = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
    record = MeterRecord.new("alice", "kernel-0a1b2c3d4e5f", "gpu", started, Decimal(4), 900)
    record.kernel, record.notebook = "0a1b2c3d4e5f", "course/train.ipynb"
    assert record.reason(0).startswith(
        "GPU kernel alice/kernel-0a1b2c3d4e5f for course/train.ipynb (gpu) at 4 credits/hour"
    )
    assert record.metadata(0)["notebook"] == "course/train.ipynb"
    assert record.metadata(0)["kernel"] == "0a1b2c3d4e5f"
    again = MeterRecord.from_state(json.loads(json.dumps(record.to_state())))
    assert (again.reason(1), again.refunded) == (record.reason(1), record.title)
    # a server's words are as before
    server = MeterRecord.new("alice", "", "gpu", started, Decimal(4), 900)
    assert server.reason(0).startswith("Server alice (gpu)") and server.refunded == "alice"
    assert "kernel" not in server.metadata(0)


def test_the_idle_culler_leaves_a_gpu_kernel_to_the_hubs_own_time_out():
    limits = ProfileIdleLimits(PROFILES)
    assert limits.limit({"profile": "gpu", "kernel": {"id": "0a1b2c3d4e5f"}}, 3600) == 0.0
    assert limits.limit({"profile": "gpu"}, 3600) == 3600.0


KERNEL = {
    "id": "0a1b2c3d4e5f",
    "parent": "",
    "notebook": "t.ipynb",
    "cwd": "",
    "connection_dir": ".gpuhub/kernels/x",
}


async def test_a_kernel_server_runs_gpuhub_kernel_waits_in_line_and_the_idle_culler_leaves_it():
    from hub_ext.docker.spawner import GPUDockerSpawner
    from hub_ext.kernels.workload import kernel_of
    from tests.fixtures.members import fake_user

    profile = {**PROFILES[1], "cull_idle_timeout": 900, "gpu_idle_timeout": 600}
    spawner = GPUDockerSpawner(user=fake_user(), profile_list=[profile])
    spawner.user_options = {"profile": "gpu", "wait": True, "kernel": KERNEL}
    await spawner.load_profile()
    assert (kernel_of(spawner), spawner.wait_requested, spawner.gpus) == (KERNEL, True, 1)
    # the kernels' own idle time-out applies, not the idle culler's; the GPU-idle one stays
    assert (spawner.cull_idle_timeout, spawner.gpu_idle_timeout) == (0, 600)
    assert spawner.workload.command == ("gpuhub-kernel",)
    assert json.loads(spawner.core_environment()["GPUHUB_KERNEL"]) == KERNEL
    assert spawner.container_labels()["io.gpuhub.kernel"] == KERNEL["id"]

    spawner.user_options = {"profile": "gpu"}  # the same spawner's next start as a server
    await spawner.load_profile()
    assert kernel_of(spawner) is None and spawner.cull_idle_timeout == 900
    assert "GPUHUB_KERNEL" not in spawner.core_environment()

    spawner.user_options = {"profile": "gpu", "kernel": "x"}
    with pytest.raises(Exception, match="made by the hub only"):
        await spawner.load_profile()


@pytest.mark.parametrize(
    ("backend", "runs"),
    [
        pytest.param("hub_ext.docker.spawner.GPUDockerSpawner", {"job", "kernel"}, id="docker"),
        pytest.param("hub_ext.slurm.spawner.GPUSlurmSpawner", {"job", "kernel"}, id="slurm"),
        pytest.param("tests.skeleton_backend.SkeletonSpawner", set(), id="skeleton"),
    ],
)
async def test_a_backend_runs_the_workloads_it_declares_and_refuses_the_others_in_words(
    backend, runs
):
    """The seam: a backend names the workloads it runs
    (``runs_workloads``); the lifecycle's first step refuses any other with 501 in its
    words, before a hook is asked or anything taken, and the server stays a server."""
    from tornado import web
    from traitlets.utils.importstring import import_item

    from hub_ext.jobs.workload import NotebookJob
    from hub_ext.kernels.workload import GPUKernel
    from hub_ext.spawn.workload import Server
    from tests.fixtures.members import fake_user

    spawner = import_item(backend)(user=fake_user(), profile_list=[PROFILES[1]])
    assert {w.option for w in (Server, NotebookJob, GPUKernel) if spawner.runs(w)} == {
        None,
        *runs,
    }
    asks = {"kernel": KERNEL, "job": {"id": "j1", "max_seconds": 60}}
    for option, workload in (("kernel", GPUKernel), ("job", NotebookJob)):
        spawner.user_options = {"profile": "gpu", option: asks[option]}
        if option in runs:
            await spawner.load_profile()
            assert isinstance(spawner.workload, workload)
            continue
        with pytest.raises(web.HTTPError) as e:
            await spawner.load_profile()
        assert (e.value.status_code, e.value.log_message) == (
            501,
            f"This hub's backend runs no {workload.noun}.",
        )
        assert isinstance(spawner.workload, Server)


def test_the_named_server_limit_leaves_gpu_kernels_and_jobs_out(hub_db):
    from types import SimpleNamespace

    from hub_ext.jobs import store as jobs_store
    from hub_ext.kernels.hubconfig import KernelsNamedServerLimit

    kernel = store.insert(hub_db, user="alice", profile="gpu", connection_dir=".gpuhub/kernels/x")
    jobs_store.insert(
        hub_db,
        user="alice",
        profile="gpu",
        input_path="a",
        input_filename="a",
        output_dir="o",
        status="QUEUED",
    )
    job = jobs_store.load(hub_db, "alice")[0]
    user = SimpleNamespace(
        name="alice", orm_spawners={"": 1, "dev": 1, kernel.server_name: 1, job.server_name: 1}
    )
    handler = SimpleNamespace(path_args=["alice"], db=hub_db, find_user=lambda name: user)
    assert KernelsNamedServerLimit(1)(handler) == 3
    assert KernelsNamedServerLimit(1)(SimpleNamespace(path_args=[])) == 1


async def test_a_slurm_kernel_job_runs_gpuhub_kernel_and_every_server_is_told_to_relay():
    from hub_ext.kernels.workload import GPUKernel
    from hub_ext.slurm.spawner import GPUSlurmSpawner
    from tests.fixtures.members import fake_user

    spawner = GPUSlurmSpawner(user=fake_user(), profile_list=[PROFILES[1]])
    spawner.user_options = {"profile": "gpu", "wait": True, "kernel": KERNEL}
    await spawner.load_profile()
    assert spawner.runs(GPUKernel)
    assert " gpuhub-kernel " in f" {spawner.cmd_formatted_for_batch()} "
    env = spawner.core_environment()
    assert json.loads(env["GPUHUB_KERNEL"]) == KERNEL
    assert env["GPUHUB_KERNEL_TRANSPORT"] == "relay"
    assert spawner.workload.ended_reason == "kernel_ended"

    spawner.user_options = {"profile": "gpu"}  # her own server: JupyterLab, told to relay
    await spawner.load_profile()
    assert "jupyterhub-singleuser" in spawner.cmd_formatted_for_batch()
    assert "gpuhub-kernel" not in spawner.cmd_formatted_for_batch()
    assert spawner.core_environment()["GPUHUB_KERNEL_TRANSPORT"] == "relay"
    assert spawner.workload.ended_reason == "gone"


@pytest.mark.parametrize(
    "model, reaches",
    [
        ({"kind": "user", "name": "alice", "scopes": ["custom:gpuhub:kernels!user=alice"]}, True),
        (
            {"kind": "user", "name": "alice", "scopes": ["access:servers!server=alice/kernel-a"]},
            True,
        ),
        ({"kind": "user", "name": "alice", "scopes": ["access:servers!user=alice"]}, True),
        # her token for another of her servers only, or without the scopes
        ({"kind": "user", "name": "alice", "scopes": ["access:servers!server=alice/"]}, False),
        ({"kind": "user", "name": "alice", "scopes": ["read:users!user=alice"]}, False),
        # anyone else, an admin with every scope included, a service; no answer
        ({"kind": "user", "name": "bob", "scopes": ["custom:gpuhub:kernels!user=bob"]}, False),
        ({"kind": "user", "name": "root", "scopes": ["access:servers"]}, False),
        ({"kind": "service", "name": "alice", "scopes": ["access:servers"]}, False),
        (None, False),
    ],
)
def test_only_the_owners_token_reaches_a_slurm_kernels_relay(model, reaches, monkeypatch):
    """gpuhub-kernel's relay on the kernel's port (images/base/gpuhub_kernels); the real
    probes: tests/test_slurm_kernels_hub.py."""
    from pathlib import Path

    package = Path(__file__).parents[1] / "images" / "base" / "gpuhub_kernels"
    monkeypatch.syspath_prepend(str(package))
    from gpuhub_kernels.relay import allowed

    assert allowed(model, "alice", "kernel-a") is reaches
