"""A member's own server creates a notebook job through Jupyter Scheduler, in a real hub.

What JupyterLab's "Create Job" form calls is Jupyter Scheduler's REST API in the member's
server (``/user/<name>/scheduler/...``); the image's ``gpuhub_scheduler`` forwards it to the
hub's jobs API with the server's own token (docs/howto/notebook-jobs.md). Here a real hub
with the notebook image (``GPUHUB_TEST_IMAGE``, default ``gpuhub/base:latest``) starts
alice's CPU server; bob's GPU server holds the hub's only GPU, so alice's job waits in the
line, where its detail shows its place, until she stops it; with the GPU free, her next job
runs to its end and the Scheduler links its files in her workspace. What a job computes, its
GPU and its credits are tested in tests/test_jobs_hub.py; the plugin alone against a
stand-in of the endpoints in tests/images/test_notebook_jobs_plugin.py.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.fixtures.hub import eventually

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "PyTorch", "slug": "pytorch", "gpus": 1, "credits_per_hour": 1},
]
NOTEBOOK = {
    "cells": [{"cell_type": "code", "metadata": {}, "source": "print(6 * 7)", "outputs": []}],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture
async def hub(hub_factory, tmp_path):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps(PROFILES))
    return await hub_factory(
        extra_config="c.Line.update_interval = 0.2\nc.GPUPool.refresh_interval = 0.2\n"
        "c.Jobs.check_interval = 0.5\n",
        GPUHUB_PROFILES=str(path),
        GPUHUB_GPUS="simulated:1",
        GPUHUB_CREDITS="off",
    )


async def test_member_creates_a_job_in_her_cpu_server_sees_its_place_and_its_results(hub):
    alice = await hub.create_user("alice")
    await hub.create_user("bob")
    assert (await hub.spawn("bob", {"profile": "pytorch"})).status_code in (201, 202)
    await hub.wait_ready("bob")
    assert (await hub.spawn("alice", {"profile": "cpu"})).status_code in (201, 202)
    await hub.wait_ready("alice")
    async with httpx.AsyncClient(
        base_url=f"{hub.url}/user/alice",
        headers={"Authorization": f"token {alice}"},
        timeout=30,
    ) as server:

        async def detail(job_id):
            r = await server.get(f"/scheduler/jobs/{job_id}")
            assert r.status_code == 200, r.text
            return r.json()

        for path, body in [
            ("work/train.ipynb", {"type": "notebook", "format": "json", "content": NOTEBOOK}),
            ("work/notes.txt", {"type": "file", "format": "text", "content": "not a notebook"}),
        ]:
            r = await server.put(f"/api/contents/{path}", json=body)
            assert r.status_code in (200, 201), r.text

        envs = await server.get("/scheduler/runtime_environments")
        assert envs.status_code == 200, envs.text
        # the form lists an environment by its name and sends it back: the label, for both
        assert [(e["name"], e["label"], e["metadata"]["profile"]) for e in envs.json()] == [
            ("PyTorch, 1 GPU, 1.00 credits/h, 0 of 1 free",) * 2 + ("pytorch",)
        ]

        # bob's server holds the only GPU: the job waits, its place in its detail
        job = {
            "name": "train",
            "input_uri": "work/train.ipynb",
            "runtime_environment_name": "pytorch",
            "output_formats": ["ipynb"],
            "parameters": {"epochs": "3"},
        }
        created = await server.post("/scheduler/jobs", json=job)
        assert created.status_code == 200, (created.text, hub.log()[-3000:])
        first = created.json()["job_id"]

        async def queued_with_place():
            found = await detail(first)
            place = found.get("status_message") or ""
            return found if place.startswith("Waiting for a GPU") else None

        waiting = await eventually(queued_with_place, what="alice's job waiting with its place")
        assert waiting["status"] == "QUEUED", waiting
        assert re.fullmatch(r"Waiting for a GPU: 1st in line, .+", waiting["status_message"])
        assert waiting["parameters"] == {"epochs": "3"}
        listed = (await server.get("/scheduler/jobs")).json()
        assert [j["job_id"] for j in listed["jobs"]] == [first]
        # the hub is the record: the same job through its own API, with alice's token
        mine = await hub.api("GET", f"/gpuhub/jobs/{first}", token=alice)
        assert mine.json()["output_dir"].startswith("jobs/train-"), mine.text

        # a refusal reaches the form in the hub's own words
        refused = await server.post(
            "/scheduler/jobs", json={**job, "name": "notes", "input_uri": "work/notes.txt"}
        )
        direct = await hub.api(
            "POST", "/gpuhub/jobs", token=alice, json={**job, "input_uri": "notes.txt"}
        )
        assert 400 <= direct.status_code < 500, direct.text
        assert refused.json()["message"] == direct.json()["message"]

        # Stop: the job leaves the line
        stopped = await server.patch(f"/scheduler/jobs/{first}", json={"status": "STOPPED"})
        assert stopped.status_code == 204, stopped.text

        async def has_status(job_id, *statuses):
            found = await detail(job_id)
            return found if found["status"] in statuses else None

        await eventually(lambda: has_status(first, "STOPPED"), what="alice's job stopped")
        line = await hub.api("GET", "/gpuhub/line", token=alice)
        assert line.json()["places"] == [], line.text

        # with the GPU free, a job runs to its end; its files are in her workspace, linked
        await hub.stop_server("bob")
        created = await server.post("/scheduler/jobs", json={**job, "name": "train again"})
        assert created.status_code == 200, created.text
        second = created.json()["job_id"]
        done = await eventually(
            lambda: has_status(second, "COMPLETED", "FAILED", "STOPPED"),
            timeout=120,
            what="alice's second job ended",
        )
        assert done["status"] == "COMPLETED", (done, hub.log()[-3000:])
        files = {f["file_format"]: f["file_path"] for f in done["job_files"]}
        assert sorted(files) == ["input", "ipynb", "log"], done
        assert all(path.startswith(f"work/jobs/train-{second}/") for path in files.values())
        assert done["downloaded"] is True
        executed = await server.get(f"/api/contents/{files['ipynb']}")
        outputs = [o for c in executed.json()["content"]["cells"] for o in c.get("outputs", [])]
        assert "42\n" in [o.get("text") for o in outputs], outputs
