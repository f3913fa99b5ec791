"""A member's own server creates a notebook job through Jupyter Scheduler, in a real hub.

What JupyterLab's "Create Job" form calls is Jupyter Scheduler's REST API in the member's
server (``/user/<name>/scheduler/...``); the image's ``gpuhub_scheduler`` forwards it to the
hub's jobs API with the server's own token (docs/howto/notebook-jobs.md). Here a real hub
with the notebook image (``GPUHUB_TEST_IMAGE``, default ``gpuhub/base:latest``) starts
alice's CPU server; bob's GPU server holds the hub's only GPU, so alice's job waits in the
line, where its detail shows its place, until she stops it. Running a job to its end is
tested with the runner (tests/test_jobs_hub.py); the plugin alone against a stand-in of the
endpoints in tests/images/test_notebook_jobs_plugin.py.
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
        extra_config="c.Line.update_interval = 0.2\nc.GPUPool.refresh_interval = 0.2\n",
        GPUHUB_PROFILES=str(path),
        GPUHUB_GPUS="simulated:1",
        GPUHUB_CREDITS="off",
    )


async def test_member_creates_a_job_in_her_cpu_server_sees_its_place_and_stops_it(hub):
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
        for path, body in [
            ("work/train.ipynb", {"type": "notebook", "format": "json", "content": NOTEBOOK}),
            ("work/notes.txt", {"type": "file", "format": "text", "content": "not a notebook"}),
        ]:
            r = await server.put(f"/api/contents/{path}", json=body)
            assert r.status_code in (200, 201), r.text

        envs = await server.get("/scheduler/runtime_environments")
        assert envs.status_code == 200, envs.text
        assert [(e["name"], e["label"]) for e in envs.json()] == [
            ("pytorch", "PyTorch, 1 GPU, 1.00 credits/h, 0 of 1 free")
        ]

        job = {
            "name": "train",
            "input_uri": "work/train.ipynb",
            "runtime_environment_name": "pytorch",
            "output_formats": ["ipynb"],
            "parameters": {"epochs": "3"},
        }
        created = await server.post("/scheduler/jobs", json=job)
        assert created.status_code == 200, (created.text, hub.log()[-3000:])
        job_id = created.json()["job_id"]

        async def detail():
            r = await server.get(f"/scheduler/jobs/{job_id}")
            assert r.status_code == 200, r.text
            return r.json()

        waiting = await eventually(
            lambda: _queued_with_place(detail), what="alice's job waiting with its place"
        )
        assert re.fullmatch(r"Waiting for a GPU: 1st in line, .+", waiting["status_message"])
        assert waiting["parameters"] == {"epochs": "3"}
        listed = (await server.get("/scheduler/jobs")).json()
        assert [j["job_id"] for j in listed["jobs"]] == [job_id]
        # the hub is the record: the same job through its own API, with alice's token
        mine = await hub.api("GET", f"/gpuhub/jobs/{job_id}", token=alice)
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

        stopped = await server.patch(f"/scheduler/jobs/{job_id}", json={"status": "STOPPED"})
        assert stopped.status_code == 204, stopped.text

        async def stopped_now():
            return (await detail())["status"] == "STOPPED"

        await eventually(stopped_now, what="alice's job stopped")
        line = await hub.api("GET", "/gpuhub/line", token=alice)
        assert line.json()["places"] == [], line.text


async def _queued_with_place(detail):
    job = await detail()
    place = job.get("status_message") or ""
    return job if job["status"] == "QUEUED" and place.startswith("Waiting for a GPU") else None
