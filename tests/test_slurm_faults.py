"""The Slurm backend when things go wrong, and its credits: a real hub, a real two-node
cluster, the reference Credits service.  Each test stands alone (its own members)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from decimal import Decimal

import pytest

from tests.fixtures.hub import eventually
from tests.test_credits_hub import balance, grant, settles
from tests.test_line_hub import runs_of

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 1},
]

#: the hub notices a job that ended behind its back at its next poll of the server
FAST_POLL = "c.GPUSlurmSpawner.poll_interval = 1\nc.CreditsHook.meter_period = 0.5\n"


@pytest.fixture
def member(slurm_cluster) -> str:
    return slurm_cluster.fresh_member("ghs")


@pytest.fixture
async def admin(credits_service):
    async with credits_service.client(admin=True) as client:
        yield client


@pytest.fixture
def credits_slurm_hub(slurm_hub, credits_service):
    async def make(**env):
        return await slurm_hub(
            PROFILES,
            extra_config=FAST_POLL,
            GPUHUB_CREDITS_URL=credits_service.url,
            GPUHUB_CREDITS_TOKEN=credits_service.hub_token,
            **env,
        )

    return make


def hold_every_gpu(cluster, user: str, gpus: int = 4) -> list[str]:
    """``gpus`` plain jobs as ``user`` that take as many GPUs of the cluster (every one by
    default; 10 min limit)."""
    jobs = []
    for _ in range(gpus):
        out = cluster.run(
            "sbatch",
            "--parsable",
            "--gres=gpu:1",
            "--time=10",
            "--output=/dev/null",
            "--wrap=sleep 600",
            user=user,
        ).stdout
        jobs.append(out.strip())
    cluster.wait_for(
        "the holding jobs to run", lambda: all(cluster.job_state(j) == "RUNNING" for j in jobs)
    )
    return jobs


async def stopped(hub, name) -> bool:
    return await hub.stopped(name)


async def refunded(admin, member) -> None:
    """The meter settles a server that ended without the hub stopping it: the unused part
    of the paid interval comes back (balance above 10.00 - 0.25)."""

    async def above():
        return await balance(admin, member) > Decimal("9.75")

    await eventually(above, 30, f"the refund of {member}'s unused credits")


async def places(hub, token: str) -> list[dict]:
    """The line's places the owner of ``token`` sees (``GET /hub/api/gpuhub/line``)."""
    r = await hub.api("GET", "/gpuhub/line", token=token)
    assert r.status_code == 200, r.text
    return r.json()["places"]


def pending_job(cluster, user: str) -> str:
    """The id of ``user``'s one job, once Slurm has it pending for want of a GPU."""

    def find():
        out = cluster.run("squeue", "-h", "-u", user, "-o", "%i %T %r").stdout.split()
        return out[0] if out[1:3] in (["PENDING", "Resources"], ["PENDING", "Priority"]) else None

    return cluster.wait_for(f"{user}'s job to wait for a GPU", find)


async def running_gpu_server(hub, admin, member) -> str:
    """``member`` with 10 credits and a ready server of the "gpu" profile; their token."""
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")
    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(member, timeout=180)
    return token


async def test_credits_are_debited_when_the_job_runs_not_while_it_waits(
    credits_slurm_hub, slurm_cluster, admin, member
):
    holder = slurm_cluster.fresh_member("ghs")
    holds = hold_every_gpu(slurm_cluster, holder)
    hub = await credits_slurm_hub()
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    r = await hub.spawn(member, {"profile": "gpu", "wait": True})
    assert r.status_code == 202, r.text
    jobs = slurm_cluster.wait_for(
        "the member's job",
        lambda: [
            line.split()[0]
            for line in slurm_cluster.run(
                "squeue", "-h", "-u", member, "-o", "%i %T"
            ).stdout.splitlines()
        ],
    )
    assert slurm_cluster.job_state(jobs[0]) == "PENDING"
    await settles(admin, member, [("grant", "10.00")], hub)  # waiting costs nothing

    slurm_cluster.run("scancel", holds[0])
    await hub.wait_ready(member, timeout=180)
    await settles(admin, member, [("grant", "10.00"), ("debit", "0.25")], hub)
    await hub.stop_server(member, timeout=120)
    # settled on stop: the minutes it ran are paid, the rest of the interval refunded
    assert Decimal("9.75") < await balance(admin, member) < Decimal("10.00")


async def test_a_pending_spawn_cancelled_by_the_member_costs_nothing(
    credits_slurm_hub, slurm_cluster, admin, member
):
    holder = slurm_cluster.fresh_member("ghs")
    hold_every_gpu(slurm_cluster, holder)
    hub = await credits_slurm_hub()
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    r = await hub.spawn(member, {"profile": "gpu", "wait": True})
    assert r.status_code == 202, r.text
    await hub.stop_server(member, timeout=120)
    assert slurm_cluster.run("squeue", "-h", "-u", member).stdout.strip() == ""
    await settles(admin, member, [("grant", "10.00")], hub)


async def test_spawn_refused_at_once_while_slurmctld_is_down_and_running_servers_stay(
    credits_slurm_hub, slurm_cluster, admin, member
):
    hub = await credits_slurm_hub(GPUHUB_CREDITS="off")
    other = slurm_cluster.fresh_member("ghs")
    token = await hub.create_user(member)
    await hub.create_user(other)
    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(member, timeout=180)

    pid_file = slurm_cluster.dir / "run" / "slurmctld.pid"
    os.kill(int(pid_file.read_text()), signal.SIGSTOP)  # alive, but answers nobody
    try:
        r = await hub.spawn(other, {"profile": "gpu"})
        assert r.status_code == 503, r.text
        assert r.json()["message"] == (
            "The cluster's scheduler is not answering, so no server can start right now. "
            "Servers already running are not affected; try again in a few minutes."
        )
        assert "Traceback" not in r.text
        # the running server still answers through the proxy, and the hub keeps it
        page = await hub.client.get(
            f"/user/{member}/api/status", headers={"Authorization": f"token {token}"}
        )
        assert page.status_code == 200, page.text
        assert await hub.running(member)
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGCONT)


async def test_a_job_cancelled_behind_the_hubs_back_is_seen_stopped_and_refunded(
    credits_slurm_hub, slurm_cluster, admin, member
):
    hub = await credits_slurm_hub()
    await running_gpu_server(hub, admin, member)
    await settles(admin, member, [("grant", "10.00"), ("debit", "0.25")], hub, seconds=0.5)

    subprocess.run(["scancel", "-u", member], env={**os.environ, **slurm_cluster.env}, check=True)
    await eventually(lambda: stopped(hub, member), 60, f"{member}'s server stopped")
    await refunded(admin, member)


async def test_a_node_taken_down_under_a_server_stops_it_and_refunds(
    credits_slurm_hub, slurm_cluster, admin, member
):
    hub = await credits_slurm_hub()
    await running_gpu_server(hub, admin, member)
    node = slurm_cluster.run("squeue", "-h", "-u", member, "-o", "%N").stdout.strip()
    try:
        slurm_cluster.run(
            "scontrol", "update", f"nodename={node}", "state=down", "reason=gpuhub-test"
        )
        await eventually(lambda: stopped(hub, member), 60, f"{member}'s server stopped")
        await refunded(admin, member)
        [run] = runs_of(hub, member)  # the run record says why
        assert run.stopped_at is not None
        assert (run.stop_reason, run.stop_detail) == ("node_down", f"node {node} down: gpuhub-test")
    finally:
        # an admin's down lasts until they resume the node (ReturnToService=1)
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        slurm_cluster.wait_for(
            "the node to come back",
            lambda: (
                slurm_cluster.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()
                in ("idle", "mixed")
            ),
        )


async def test_a_hub_killed_with_a_running_server_readopts_it_by_job_id_and_charges_once(
    credits_slurm_hub, slurm_cluster, admin, member
):
    hub = await credits_slurm_hub()
    token = await running_gpu_server(hub, admin, member)
    [job] = slurm_cluster.run("squeue", "-h", "-u", member, "-o", "%i").stdout.split()
    await settles(admin, member, [("grant", "10.00"), ("debit", "0.25")], hub, seconds=0.5)

    hub.kill()  # SIGKILL: no clean-up at all
    await hub.start()
    assert await hub.running(member)
    assert slurm_cluster.job_state(job) == "RUNNING"
    page = await hub.client.get(
        f"/user/{member}/api/status", headers={"Authorization": f"token {token}"}
    )
    assert page.status_code == 200, page.text
    await settles(admin, member, [("grant", "10.00"), ("debit", "0.25")], hub)
    await hub.stop_server(member, timeout=120)
    assert slurm_cluster.job_state(job) == ""
    assert Decimal("9.75") < await balance(admin, member) < Decimal("10.00")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
async def test_a_hub_stopped_with_a_job_pending_takes_it_back_by_job_id_in_its_place(
    credits_slurm_hub, slurm_cluster, admin, member, signum
):
    """kill -9 (or a clean stop: JupyterHub then cancels the pending starts, which must
    not cancel their jobs) with one server running and two members' jobs pending: after the restart
    the pending jobs are the same Slurm jobs (same ids, same order in line), each shown
    in line again, and the first starts by itself when a GPU frees; each member is
    debited once, when their job runs."""
    holder = slurm_cluster.fresh_member("ghs")
    hub = await credits_slurm_hub()
    await running_gpu_server(hub, admin, member)
    holds = hold_every_gpu(slurm_cluster, holder, gpus=3)
    waiting = {}
    for _ in range(2):
        user = slurm_cluster.fresh_member("ghs")
        token = await hub.create_user(user)
        await grant(admin, user, "10.00")
        r = await hub.spawn(user, {"profile": "gpu", "wait": True})
        assert r.status_code == 202, r.text
        waiting[user] = (token, pending_job(slurm_cluster, user))
    (first, (first_token, first_job)), (later, (later_token, later_job)) = waiting.items()

    async def in_line(want: dict) -> bool:
        seen = {}
        for token in (first_token, later_token):
            for p in await places(hub, token):
                seen[p["user"]] = (p["position"], p["waiting"])
        return seen == want

    both = {first: (1, True), later: (2, True)}
    await eventually(lambda: in_line(both), 60, "both members in line")
    hub.kill(signum)
    await hub.start()

    assert await hub.running(member)
    await eventually(lambda: in_line(both), 120, "both places taken back after the restart")
    assert [slurm_cluster.job_state(j) for j in (first_job, later_job)] == ["PENDING"] * 2
    # the holders' 10-minute limits give Slurm an estimate (squeue --start)
    mine = (await places(hub, first_token))[0]
    assert re.match(
        r"You are 1st in line for 1 GPU \(One GPU\)\. Estimated wait: about "
        r"([1-9]|10) min\.",
        mine["sentence"],
    ), mine["sentence"]
    for user in (first, later):
        await settles(admin, user, [("grant", "10.00")], hub, seconds=0.5)  # nothing yet

    slurm_cluster.run("scancel", holds[0])
    await hub.wait_ready(first, timeout=180)  # started by itself, by the same job
    assert slurm_cluster.job_state(first_job) == "RUNNING"
    assert slurm_cluster.run("squeue", "-h", "-u", first, "-o", "%i").stdout.split() == [first_job]
    await eventually(lambda: in_line({later: (1, True)}), 60, "the second member moved up")
    page = await hub.client.get(
        f"/user/{first}/api/status", headers={"Authorization": f"token {first_token}"}
    )
    assert page.status_code == 200, page.text
    await settles(admin, first, [("grant", "10.00"), ("debit", "0.25")], hub)
    await settles(admin, member, [("grant", "10.00"), ("debit", "0.25")], hub)
    await settles(admin, later, [("grant", "10.00")], hub, seconds=0.5)
