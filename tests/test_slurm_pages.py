"""What a member and an admin see on the Slurm backend: the same spawn page (free GPUs read
from Slurm, per profile's partition and GRES type), the same availability endpoint, the same
GPU board (every node's GPUs, the job and member holding each, drained nodes with Slurm's
reason, pending jobs in Slurm's order, Stop), and ``gpuhub gpus`` / ``gpuhub usage``.

A real hub and proxy, the OIDC provider, batchspawner and the two-node test cluster
(tests/fixtures/slurm.py: 2 untyped stand-in GPUs per node, partition ``gpu``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from tests.fixtures.hub import eventually
from tests.fixtures.oidc import ADMINS
from tests.test_profiles_hub import cards

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
    {"display_name": "Two GPUs", "slug": "two", "gpus": 2},
    {"display_name": "One A100", "slug": "a100", "gpus": "a100:1"},  # GRES gpu:a100:1
]


@pytest.fixture
def name(slurm_cluster):
    """A fresh member with an account on the cluster."""
    return lambda: slurm_cluster.fresh_member("ghp")


def hold_gpus(cluster, user: str, count: int, node: str = "") -> list[str]:
    """``count`` plain one-GPU jobs as ``user`` (on ``node`` when given), running (10 min
    limit); their ids."""
    where = [f"--nodelist={node}"] if node else []
    jobs = [
        cluster.run(
            "sbatch",
            "--parsable",
            "--gres=gpu:1",
            "--time=10",
            *where,
            "--output=/dev/null",
            "--wrap=sleep 600",
            user=user,
        ).stdout.strip()
        for _ in range(count)
    ]
    cluster.wait_for(
        "the holding jobs to run", lambda: all(cluster.job_state(j) == "RUNNING" for j in jobs)
    )
    return jobs


def gpuhub(hub, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", *args],
        capture_output=True,
        text=True,
        env=hub.env,
        timeout=60,
    )


async def test_cards_show_free_gpus_from_slurm_per_profile_and_say_when_slurm_is_silent(
    slurm_hub, slurm_cluster, name
):
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    member, holder = name(), name()
    hold_gpus(slurm_cluster, holder, 3)  # one GPU left, on one node
    browser = await hub.login(member)

    shown = cards((await browser.get("/hub/spawn")).text)
    assert set(shown) == {"cpu", "gpu", "two", "a100"}
    assert "1 of 4 GPUs free now" in shown["gpu"]
    assert "<dt>Python</dt><dd>3.11" in shown["gpu"]  # the image's labels, as on Docker
    [radio] = re.findall(r"<input[^>]*>", shown["gpu"])
    assert "disabled" not in radio
    # two GPUs must be on one node: none has two free, so the member may wait in line
    assert re.search(r'value="two"[^>]*disabled', shown["two"])
    assert "it needs 2 GPUs on one node and only 1 of 4 are free" in shown["two"]
    assert not re.search(r'class="[^"]*gpuhub-wait"[^>]*hidden', shown["two"])
    # a GRES type no node has: "0 of 0", and no wait that could never end
    assert "0 of 0 a100 GPUs free now" in shown["a100"]
    assert "has 1 a100 GPUs" in shown["a100"]
    assert re.search(r'class="[^"]*gpuhub-wait"[^>]*hidden', shown["a100"])

    model = (await browser.get("/hub/api/gpuhub/availability")).json()
    assert (model["inventory"], model["total"], model["free"], model["allocated"]) == (
        "slurm",
        4,
        1,
        3,
    )
    assert model["profiles"]["gpu"]["available"] is True
    assert (model["profiles"]["gpu"]["free"], model["profiles"]["gpu"]["total"]) == (1, 4)
    assert model["profiles"]["two"]["available"] is False
    assert model["profiles"]["two"]["can_wait"] is True
    assert model["profiles"]["cpu"]["available"] is True

    pid = int((slurm_cluster.dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGSTOP)  # alive, but answers nobody
    try:

        async def silent():
            shown = cards((await browser.get("/hub/spawn")).text)
            return "scheduler is not answering" in shown["gpu"] and shown

        shown = await eventually(silent, 30, "the cards to say Slurm is silent")
        assert "Traceback" not in shown["gpu"]
        assert "scheduler is not answering" not in shown["cpu"]  # no GPU, no scheduler wait
        model = (await browser.get("/hub/api/gpuhub/availability")).json()
        assert model["error"].startswith("The cluster's scheduler is not answering")
        assert model["profiles"]["gpu"]["available"] is False
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_the_board_shows_nodes_jobs_and_the_queue_and_stop_cancels_the_job(
    slurm_hub, slurm_cluster, name
):
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    member, waiter, outsider = name(), name(), name()
    boss = await hub.login("boss", groups=[ADMINS])
    await hub.create_user(member)
    await hub.create_user(waiter)
    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(member, timeout=180)
    [job] = slurm_cluster.run("squeue", "-h", "-u", member, "-o", "%i").stdout.split()
    node = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    [outside] = hold_gpus(slurm_cluster, outsider, 1, node=node)  # the node is full
    other = "node2" if node == "node1" else "node1"
    slurm_cluster.run(
        "scontrol", "update", f"nodename={other}", "state=drain", "reason=gpuhub board test"
    )
    try:
        # no node can give two now: the member asks to wait in line
        r = await hub.spawn(waiter, {"profile": "two", "wait": True})
        assert r.status_code in (201, 202), r.text
        board = (await hub.browser_api(boss, "GET", "/gpuhub/gpus")).json()
        rows = {d["uuid"]: d for d in board["devices"]}
        assert len(rows) == 4 and board["inventory"] == "slurm"
        [held] = [d for d in rows.values() if d["owner"] and d["owner"]["job"] == job]
        assert held["state"] == "held" and held["node"] == node
        assert (held["owner"]["user"], held["owner"]["profile"]) == (member, "gpu")
        assert held["owner"]["stop_url"] == f"/hub/api/users/{member}/server"
        [theirs] = [d for d in rows.values() if d["owner"] and d["owner"]["job"] == outside]
        assert theirs["state"] == "outside" and theirs["owner"]["stop_url"] is None
        drained = [d for d in rows.values() if d["node"] == other]
        assert {d["health_reason"] for d in drained} == {"gpuhub board test"}
        assert all(d["state"].startswith("drain") for d in drained)
        nodes = {n["name"]: n for n in board["nodes"]}
        assert nodes[other]["reason"] == "gpuhub board test"
        assert not nodes[other]["available"]
        pending = await eventually(
            lambda: _pending(hub, boss, waiter), 60, f"{waiter}'s job on the board"
        )
        assert (pending["position"], pending["profile"], pending["partition"]) == (1, "two", "gpu")

        page = (await boss.get("/hub/gpus")).text
        assert "gpuhub board test" in page and f"{waiter}" in page

        table = gpuhub(hub, "gpus")
        assert table.returncode == 0, table.stderr
        assert re.search(
            rf"{node}/gpu\d\s+held\s.*{member} \(gpu, 0m\) job {job}$", table.stdout, re.M
        ), table.stdout
        assert f"node {other} is drained: gpuhub board test" in table.stdout
        assert re.search(rf"^\s+1\s+\d+\s+gpu\s+.*{waiter} \(two\)$", table.stdout, re.M)

        # Stop on the row: JupyterHub stops the member's server, the spawner cancels the job
        r = await hub.browser_api(boss, "DELETE", held["owner"]["stop_url"][len("/hub/api") :])
        assert r.status_code in (202, 204), r.text
        await eventually(lambda: hub.stopped(member), 60, f"{member}'s server stopped")
        slurm_cluster.wait_for(
            "the job to be cancelled", lambda: slurm_cluster.job_state(job) in ("", "CANCELLED")
        )
    finally:
        await hub.stop_server(waiter, timeout=120)  # before its job could run on the other
        slurm_cluster.run("scontrol", "update", f"nodename={other}", "state=resume", check=False)

    # the run record: the job's GPU, so `gpuhub usage` counts its GPU-hours
    [run] = hub_runs(hub)
    assert (run.username, run.profile, run.stop_reason) == (member, "gpu", "stopped")
    assert run.devices == [held["uuid"]]
    since = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    report = gpuhub(hub, "usage", "--since", since, "--csv")
    assert report.returncode == 0, report.stderr
    rows = {row[0]: row for row in (line.split(",") for line in report.stdout.splitlines())}
    assert rows[member][1] == "1"  # one server
    assert waiter not in rows  # a job that never ran is no run


def hub_runs(hub) -> list:
    """The hub's run records (hub_ext.common.runs), read from its SQLite database."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from hub_ext.common.runs import runs_overlapping

    engine = create_engine(f"sqlite:///{hub.state_dir / 'jupyterhub.sqlite'}")
    try:
        with Session(engine) as session:
            runs = runs_overlapping(session, datetime.now(UTC) - timedelta(days=1))
            session.expunge_all()
            return runs
    finally:
        engine.dispose()


async def _pending(hub, boss, user) -> dict | None:
    board = (await hub.browser_api(boss, "GET", "/gpuhub/gpus")).json()
    return next((j for j in board["pending"] if j["user"] == user), None)
