"""The Slurm backend through a submit host: a real hub whose every Slurm command runs on the
test cluster's login host over OpenSSH (sshd in its own network namespace,
tests/fixtures/slurm.py ``submit_host``).  The hub itself cannot reach the cluster: its
``SLURM_CONF`` names a file that exists only on the login host (its own mount namespace),
and ``runuser`` is not on its ``PATH``, so a test that passes proves the Slurm commands and
the token file written as the member went through ssh."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.fixtures.hub import eventually
from tests.fixtures.oidc import ADMINS
from tests.test_slurm_faults import hold_every_gpu, pending_job, places
from tests.test_slurm_hub import probe

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
]

SUBMIT_HOST_DOWN = (
    "The cluster's submit host is not answering, so no server can start "
    "right now. Servers already running are not affected; try again in a "
    "few minutes."
)


@pytest.fixture
def member(slurm_cluster):
    return lambda: slurm_cluster.fresh_member("ghl")


@pytest.fixture
def login_hub(slurm_hub, submit_host):
    """A Slurm hub that reaches the cluster only through the submit host."""
    conf = submit_host.settings["GPUHUB_SLURM_CONF"]
    assert not Path(conf).exists(), f"{conf} must exist on the login host only"

    # nor can it switch to a member: runuser (/usr/sbin) is not on its PATH
    path = ":".join(p for p in os.environ["PATH"].split(":") if not p.endswith("sbin"))
    assert shutil.which("runuser", path=path) is None

    async def make(extra_config: str = ""):
        return await slurm_hub(
            PROFILES,
            extra_config=extra_config,
            GPUHUB_CREDITS="off",
            SLURM_CONF="/nonexistent/slurm.conf",
            PATH=path,
            **submit_host.settings,
        )

    return make


async def board(hub, boss) -> dict:
    r = await hub.browser_api(boss, "GET", "/gpuhub/gpus")
    assert r.status_code == 200, r.text
    return r.json()


def holders_of(model: dict) -> set[str]:
    return {d["owner"]["user"] for d in model["devices"] if d.get("owner")}


async def test_through_the_submit_host_a_member_runs_as_themself_waits_in_line_and_stops(
    login_hub, slurm_cluster, member
):
    hub = await login_hub()
    first, second, holder = member(), member(), member()
    holds = hold_every_gpu(slurm_cluster, holder, gpus=3)  # one GPU left
    boss = await hub.login("boss", groups=[ADMINS])
    tokens = {name: await hub.create_user(name) for name in (first, second)}

    r = await hub.spawn(first, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(first, timeout=180)
    seen = await probe(hub, first, tokens[first])
    uid = slurm_cluster.member(first)
    assert (seen["uid"], seen["owner"]) == (uid, uid)  # the member's own uid, on a node
    assert seen["devices"] == f"nvidia{seen['gpu']}"
    [job] = slurm_cluster.run("squeue", "-h", "-u", first, "-o", "%i").stdout.split()
    model = await board(hub, boss)
    assert model["error"] == "" and len(model["devices"]) == 4
    [held] = [d for d in model["devices"] if d.get("owner") and d["owner"]["job"] == job]
    assert held["owner"]["user"] == first

    # every GPU taken: the second member waits in line, in Slurm's order
    r = await hub.spawn(second, {"profile": "gpu", "wait": True})
    assert r.status_code in (201, 202), r.text
    pending = pending_job(slurm_cluster, second)

    async def first_in_line():
        return [(p["user"], p["position"]) for p in await places(hub, tokens[second])] == [
            (second, 1)
        ]

    await eventually(first_in_line, 60, f"{second} 1st in line")
    assert [row["job"] for row in (await board(hub, boss))["pending"]] == [pending]

    await hub.stop_server(first, timeout=120)  # scancel, on the submit host
    assert slurm_cluster.job_state(job) == ""
    await hub.wait_ready(second, timeout=180)  # the freed GPU, without asking again
    assert slurm_cluster.job_state(pending) == "RUNNING"
    for job in holds:
        slurm_cluster.run("scancel", job, check=False)


@pytest.mark.parametrize("fault", ["sshd-killed", "host-frozen"])
async def test_a_submit_host_that_does_not_answer_refuses_spawns_and_keeps_servers(
    login_hub, slurm_cluster, submit_host, member, fault
):
    """sshd killed (connection refused), or every process of the host stopped (connections
    open, nothing answers: the spawn check gives up after ``scheduler_timeout``)."""
    hub = await login_hub("c.GPUSlurmSpawner.poll_interval = 1\n")
    running, other = member(), member()
    token = await hub.create_user(running)
    boss = await hub.login("boss", groups=[ADMINS])
    browser = await hub.login(other)
    r = await hub.spawn(running, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(running, timeout=180)
    [job] = slurm_cluster.run("squeue", "-h", "-u", running, "-o", "%i").stdout.split()

    down, up = (
        (submit_host.stop, submit_host.start)
        if fault == "sshd-killed"
        else (submit_host.freeze, submit_host.thaw)
    )
    down()
    try:
        r = await hub.spawn(other, {"profile": "gpu"})
        assert r.status_code == 503, r.text
        assert r.json()["message"] == SUBMIT_HOST_DOWN
        assert "Traceback" not in r.text

        # the spawn page's cards and the availability endpoint say it too
        async def cards_say_so():
            model = (await browser.get("/hub/api/gpuhub/availability")).json()
            return model["error"] == SUBMIT_HOST_DOWN and model

        model = await eventually(cards_say_so, 30, "the availability endpoint to say so")
        assert model["profiles"]["gpu"]["available"] is False
        page = (await browser.get("/hub/spawn")).text
        assert "submit host is not answering" in page
        # the admins' board names the submit host and ssh's reason
        model = await board(hub, boss)
        assert model["error"].startswith(
            "The submit host does not answer: the submit host "
            f"{submit_host.settings['GPUHUB_SLURM_SUBMIT_HOST']}"
            " did not answer"
        ), model["error"]
        # the running server is untouched: still reachable, still the hub's, after polls
        for _ in range(3):
            status = await hub.client.get(
                f"/user/{running}/api/status", headers={"Authorization": f"token {token}"}
            )
            assert status.status_code == 200, status.text
        assert await hub.running(running)
        assert slurm_cluster.job_state(job) == "RUNNING"
    finally:
        up()

    async def on_the_board_again():
        model = await board(hub, boss)
        return model["error"] == "" and running in holders_of(model)

    await eventually(on_the_board_again, 60, f"{running}'s job on the board again")
    assert await hub.running(running)
    await hub.stop_server(running, timeout=120)
    assert slurm_cluster.job_state(job) == ""
