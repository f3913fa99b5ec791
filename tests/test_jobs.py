"""Notebook jobs without a hub: what a new job must pass (hub_ext.jobs.checks), the table
(hub_ext.jobs.store) and the profile keys.  The same refusals through a real hub:
tests/test_jobs_hub.py."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from hub_ext.jobs import store
from hub_ext.jobs.checks import (
    JobRefused,
    check_notebook,
    job_profile,
    read_notebook,
    read_request,
)
from hub_ext.jobs.handlers import environment_label, place_message
from hub_ext.jobs.intake import MemberTurns, load_notebook
from hub_ext.spawn.profiles import ProfileError, init_profiles, job_max_seconds, jobs_allowed

NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
#: a notebook whose metadata nests lists 2000 deep: more than Python's json parser goes
NESTED = '{"nbformat": 4, "cells": [], "metadata": {"a": ' + "[" * 2000 + "]" * 2000 + "}}"
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
    {"display_name": "Course GPU", "slug": "course", "gpus": 1, "allowed_groups": ["ml101"]},
    {"display_name": "Big GPU", "slug": "big", "gpus": 2, "jobs": False},
    {"display_name": "CPU jobs", "slug": "cpujobs", "jobs": True, "job_max_seconds": 60},
]


def refused(call, *args) -> tuple[int, str]:
    with pytest.raises(JobRefused) as e:
        call(*args)
    return e.value.status, e.value.message


@pytest.mark.parametrize(
    "body, words",
    [
        pytest.param([], "JSON object", id="not-an-object"),
        pytest.param({"runtime_environment_name": "gpu"}, "input_uri is missing", id="no-input"),
        pytest.param({"input_uri": "a.ipynb"}, "runtime_environment_name", id="no-profile"),
        pytest.param(
            {"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "parameters": "x=1"},
            "parameters must be a JSON object of strings",
            id="parameters-not-an-object",
        ),
        pytest.param(
            {"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "parameters": {"x": 1}},
            "must be a string",
            id="parameter-not-a-string",
        ),
        pytest.param(
            {
                "input_uri": "a.ipynb",
                "runtime_environment_name": "gpu",
                "parameters": {"import os": "1"},
            },
            "not a Python name",
            id="parameter-name-not-python",
        ),
        pytest.param(
            {"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "output_formats": ["pdf"]},
            "output_formats",
            id="unknown-format",
        ),
        pytest.param(
            {"input_uri": "a" * 2000, "runtime_environment_name": "gpu"},
            "at most 1024",
            id="long-path",
        ),
    ],
)
def test_a_create_body_that_is_not_a_job_is_refused_with_the_reason(body, words):
    status, message = refused(read_request, body)
    assert status == 400 and words in message
    assert "a" * 100 not in message  # a bad value is quoted by its start only


def test_a_create_body_is_read_with_the_executed_notebook_always_among_its_outputs():
    request = read_request(
        {
            "input_uri": "train.ipynb",
            "runtime_environment_name": "gpu",
            "parameters": {"epochs": "3"},
            "output_formats": ["html"],
            "name": "first",
            "tags": ["ignored"],  # the rest of Scheduler's CreateJob is ignored
        }
    )
    assert (request.profile, request.parameters, request.output_formats, request.name) == (
        "gpu",
        {"epochs": "3"},
        ["ipynb", "html"],
        "first",
    )


@pytest.fixture
def workspace(tmp_path):
    home = tmp_path / "home"
    (home / "sub").mkdir(parents=True)
    (home / "sub" / "nb.ipynb").write_text(json.dumps(NOTEBOOK))
    secret = tmp_path / "secret.ipynb"
    secret.write_text(json.dumps(NOTEBOOK))
    os.symlink(secret, home / "link.ipynb")
    os.symlink(tmp_path, home / "out")
    (home / "big.ipynb").write_text(json.dumps({**NOTEBOOK, "metadata": {"x": "y" * 9000}}))
    (home / "plain.ipynb").write_text("print('hello')\n")
    (home / "old.ipynb").write_text(json.dumps({**NOTEBOOK, "nbformat": 3}))
    (home / "nested.ipynb").write_text(NESTED)
    os.mkfifo(home / "fifo.ipynb")
    return str(home)


@pytest.mark.parametrize(
    "path, status, words",
    [
        pytest.param("../secret.ipynb", 400, "leaves your workspace", id="dot-dot"),
        pytest.param("sub/../../secret.ipynb", 400, "leaves your workspace", id="dot-dot-inside"),
        pytest.param("/etc/passwd.ipynb", 400, "relative", id="absolute"),
        pytest.param("link.ipynb", 403, "link", id="symlink-out"),
        pytest.param("out/secret.ipynb", 403, "link", id="symlinked-folder-out"),
        pytest.param("big.ipynb", 413, "at most", id="oversized"),
        pytest.param("plain.ipynb", 400, "does not read as a notebook", id="not-json"),
        pytest.param("old.ipynb", 400, "nbformat 4", id="old-format"),
        pytest.param("sub/nb.py", 400, "not a notebook", id="not-ipynb"),
        pytest.param("missing.ipynb", 404, "not in your workspace", id="missing"),
        pytest.param("fifo.ipynb", 403, "not a regular file", id="fifo"),
        pytest.param("nested.ipynb", 400, "nests lists or objects too deeply", id="nested"),
    ],
)
async def test_a_notebook_outside_the_workspace_or_not_a_notebook_is_refused(
    workspace, path, status, words
):
    with pytest.raises(JobRefused) as e:
        await load_notebook(workspace, path, 8192)  # read in a thread, parsed in a child
    assert (e.value.status, words in e.value.message) == (status, True), e.value.message


def test_a_deeply_nested_notebook_is_refused_in_words_in_the_hub_too(workspace):
    data = read_notebook(workspace, "nested.ipynb", 8192)
    status, message = refused(check_notebook, data, "nested.ipynb")
    assert status == 400 and "too deeply" in message


async def test_the_notebook_is_read_through_folders_of_the_workspace(workspace):
    assert json.loads(await load_notebook(workspace, "./sub//nb.ipynb", 8192)) == NOTEBOOK


async def test_a_members_job_requests_are_taken_one_at_a_time_and_a_flood_is_refused():
    turns = MemberTurns(waiting=2)
    order, release = [], asyncio.Event()

    async def request(name, n):
        async with turns.turn(name):
            order.append((name, n, "in"))
            await release.wait()
            order.append((name, n, "out"))

    tasks = [asyncio.create_task(request("alice", n)) for n in range(3)]
    other = asyncio.create_task(request("bob", 0))
    await asyncio.sleep(0.01)
    # one of alice's at a time, bob's beside hers; alice's fourth is refused at once
    assert order == [("alice", 0, "in"), ("bob", 0, "in")]
    with pytest.raises(JobRefused) as e:
        await asyncio.wait_for(request("alice", 3), 1)  # refused at once, never waits
    assert e.value.status == 429 and "3 job requests waiting" in e.value.message
    release.set()
    await asyncio.gather(*tasks, other)
    mine = [(n, step) for name, n, step in order if name == "alice"]
    assert mine == [(0, "in"), (0, "out"), (1, "in"), (1, "out"), (2, "in"), (2, "out")]
    assert turns.queued("alice") == 0


def test_jobs_run_on_gpu_profiles_unless_a_profile_says_otherwise():
    profiles = {p["slug"]: p for p in init_profiles(PROFILES)}
    assert {s: jobs_allowed(p) for s, p in profiles.items()} == {
        "cpu": False,
        "gpu": True,
        "course": True,
        "big": False,
        "cpujobs": True,
    }
    assert (job_max_seconds(profiles["gpu"]), job_max_seconds(profiles["cpujobs"])) == (86400, 60)
    with pytest.raises(ProfileError, match="job_max_seconds"):
        init_profiles([{"display_name": "x", "job_max_seconds": -1}])
    with pytest.raises(ProfileError, match="jobs must be true or false"):
        init_profiles([{"display_name": "x", "jobs": "yes"}])


@pytest.mark.parametrize(
    "slug, status, words",
    [
        pytest.param("gpu-x", 404, "No such environment", id="forged"),
        pytest.param("course", 403, "not open to you", id="not-my-group"),
        pytest.param("cpu", 403, "does not run notebook jobs", id="no-jobs"),
        pytest.param("big", 403, "does not run notebook jobs", id="jobs-off"),
    ],
)
def test_a_profile_must_exist_be_open_to_the_member_and_run_jobs(slug, status, words):
    everything = init_profiles(PROFILES)
    visible = [p for p in everything if not p.get("allowed_groups")]
    got, message = refused(job_profile, visible, everything, slug)
    assert (got, words in message) == (status, True), message
    assert "Options include: big" not in message and "cpujobs, gpu" in message


def test_a_job_ends_once(hub_db):
    row = store.insert(
        hub_db,
        user="alice",
        profile="gpu",
        input_path="jobs/a/in.ipynb",
        input_filename="a.ipynb",
        output_dir="jobs/a",
        status="IN_PROGRESS",
    )
    assert row.server_name == "job-" + row.id.replace("-", "")[:12]
    assert store.count_active(hub_db, "alice") == 1
    assert store.finish(hub_db, row, "COMPLETED", "Completed.", exit_code=0)
    assert not store.finish(hub_db, row, "FAILED", "again")
    assert (row.status, row.status_message, row.exit_code) == ("COMPLETED", "Completed.", 0)
    assert store.count_active(hub_db, "alice") == 0


JOB = {
    "id": "0b0b0b0b-0000-4000-8000-000000000001",
    "input": "jobs/nb-x/input/nb.ipynb",
    "cwd": "",
    "output_dir": "jobs/nb-x",
    "outputs": {"ipynb": "jobs/nb-x/nb.ipynb", "log": "jobs/nb-x/nb.log"},
    "parameters": {"n": "2"},
    "max_seconds": 60,
}
CULLED_GPU = {
    "display_name": "GPU",
    "slug": "gpu",
    "gpus": 1,
    "gpu_idle_timeout": 600,
    "cull_idle_timeout": 900,
    "cull_max_age": 3600,
}


async def test_a_job_server_runs_the_job_runner_waits_in_line_and_is_never_culled():
    from hub_ext.docker.spawner import GPUDockerSpawner
    from tests.fixtures.members import fake_user

    spawner = GPUDockerSpawner(user=fake_user(), profile_list=[CULLED_GPU])
    spawner.user_options = {"profile": "gpu", "job": JOB}
    await spawner.load_profile()
    assert (spawner.job, spawner.wait_requested, spawner.gpus) == (JOB, True, 1)
    assert (spawner.gpu_idle_timeout, spawner.cull_idle_timeout, spawner.cull_max_age) == (0, 0, 0)
    spawner._prepare_container({"ids": None, "workspace": "vol", "datasets": {}})
    assert spawner.cmd == ["gpuhub-notebook-job"]
    assert json.loads(spawner.environment["GPUHUB_JOB"]) == JOB
    assert spawner.environment["GPUHUB_JOB_ROOT"] == spawner.workspace_mount
    # the hub stops a Docker job's container after its report (Slurm's runner exits itself)
    assert "GPUHUB_JOB_EXIT_AFTER_REPORT" not in spawner.environment
    assert spawner.extra_create_kwargs["labels"]["io.gpuhub.job"] == JOB["id"]

    # the same spawner's next start as a server: JupyterLab, culled as its profile says
    spawner.user_options = {"profile": "gpu"}
    await spawner.load_profile()
    assert (spawner.job, spawner.wait_requested, spawner.gpu_idle_timeout) == (None, False, 600)
    spawner._prepare_container({"ids": None, "workspace": "vol", "datasets": {}})
    assert spawner.cmd is None or "gpuhub-notebook-job" not in spawner.cmd
    assert "GPUHUB_JOB" not in spawner.environment
    # where the Jupyter Scheduler plugin finds the workspace, as the hub mounts it
    assert spawner.environment["GPUHUB_WORKSPACE_MOUNT"] == spawner.workspace_mount


@pytest.mark.parametrize(
    "code, words",
    [
        pytest.param(137, "its container was killed (SIGKILL, exit code 137)", id="kill"),
        pytest.param(143, "its container was stopped (SIGTERM, exit code 143)", id="term"),
        pytest.param(3, "its container exited with code 3", id="exit"),
        pytest.param(None, "its container ended (exit code unknown)", id="unknown"),
    ],
)
def test_why_a_jobs_container_ended_is_said_in_words(code, words):
    from hub_ext.spawn.stopping import exit_words

    assert exit_words(code) == words


@pytest.mark.parametrize(
    ("position", "sentence", "estimate_s", "message"),
    [
        (2, "You are 2nd in line.", 290, "Waiting for a GPU: 2nd in line, about 5 min"),
        (1, "You are next.", 20, "Waiting for a GPU: 1st in line, less than a minute"),
        (
            3,
            "Estimated wait: unknown (nothing of this kind runs).",
            None,
            "Waiting for a GPU: 3rd in line. Estimated wait: unknown (nothing of this kind runs).",
        ),
        (11, "", None, "Waiting for a GPU: 11th in line"),
    ],
)
def test_a_queued_jobs_place_is_one_line_for_the_scheduler(position, sentence, estimate_s, message):
    assert place_message(position, sentence, estimate_s) == message


@pytest.mark.parametrize(
    "name, label",
    [
        pytest.param("PyTorch", "PyTorch, 1 GPU, 1.00 credits/h, 1 of 2 free", id="plain-name"),
        pytest.param(
            "PyTorch, 1 GPU", "PyTorch, 1 GPU, 1.00 credits/h, 1 of 2 free", id="names-its-gpu"
        ),
        pytest.param("One GPU", "One GPU, 1.00 credits/h, 1 of 2 free", id="in-words"),
        pytest.param(
            "Two A100 GPUs, big", "Two A100 GPUs, big, 1.00 credits/h, 1 of 2 free", id="kind"
        ),
        pytest.param(
            "GPU playground", "GPU playground, 1 GPU, 1.00 credits/h, 1 of 2 free", id="no-count"
        ),
    ],
)
def test_an_environments_label_names_its_gpus_once(name, label):
    assert environment_label(name, "1 GPU", 1.0, 1, 2) == label


def test_the_ledger_names_a_notebook_job_by_its_name():
    from datetime import UTC, datetime
    from decimal import Decimal

    from hub_ext.credits.metering import MeterRecord

    def record(server: str) -> MeterRecord:
        when = datetime(2026, 1, 5, tzinfo=UTC)
        return MeterRecord.new("alice", server, "pytorch", when, Decimal(4), 900)

    job = record("job-a7d70db30f9c")
    job.job = "Notebook job: train"  # as JupyterHub lists the job's server
    assert job.reason(0).startswith(
        "Notebook job: train, alice/job-a7d70db30f9c (pytorch) at 4 credits/hour"
    )
    assert job.refunded == "Notebook job: train, alice/job-a7d70db30f9c"
    assert MeterRecord.from_state(job.to_state()).reason(0) == job.reason(0)
    # a server of the member's own keeps its words
    assert record("exp").reason(0).startswith("Server alice/exp (pytorch) at")


async def test_a_members_next_job_request_is_taken_an_interval_after_her_last():
    turns = MemberTurns(interval=0.2)
    loop = asyncio.get_running_loop()
    began = []

    async def request(name):
        async with turns.turn(name):
            began.append((name, loop.time()))

    await request("alice")
    await asyncio.gather(request("alice"), request("bob"))  # bob's first is not held up
    (_, first), (who, other), (_, second) = sorted(began, key=lambda b: b[1])
    assert who == "bob" and other - first < 0.2
    assert second - first >= 0.2
