"""Reservations on the Slurm backend are Slurm's own: a real hub and proxy, the real two-node
test cluster (tests/fixtures/slurm.py, 2 stand-in GPUs per node), members' jobs under their
own uids.  The hub's reservation becomes ``gpuhub-<id>`` in ``scontrol show reservation``;
a member's job during the window runs in it; a non-member is refused by the hub and kept
pending by Slurm while the other GPUs are taken; deleting it in the hub ends Slurm's; a
restarted hub makes Slurm's match its own again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.fixtures.hub import eventually

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
]
PATH = "/gpuhub/reservations"


def slurm_reservations(cluster) -> dict[str, dict]:
    """Slurm's reservations now (name -> fields), times in UTC."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "reservation"],
        capture_output=True,
        text=True,
        env={**os.environ, **cluster.env, "TZ": "UTC"},
    ).stdout
    found = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "ReservationName" in fields:
            found[fields["ReservationName"]] = fields
    return found


def iso(when: datetime) -> str:
    return when.replace(microsecond=0).isoformat()


def job_of(cluster, user: str) -> dict:
    """The fields of ``user``'s one job (``scontrol show job``); {} when none."""
    job_id = cluster.run("squeue", "-h", "-u", user, "-o", "%i").stdout.split()
    if not job_id:
        return {}
    out = cluster.run("scontrol", "-o", "show", "job", job_id[0]).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


async def test_a_reservation_is_slurms_own_and_slurm_holds_it_for_the_group(
    slurm_hub, slurm_cluster
):
    alice = slurm_cluster.fresh_member("ghs-ra")  # in the group
    bob = slurm_cluster.fresh_member("ghs-rb")  # not in it
    other = slurm_cluster.fresh_member("ghs-ro")  # a cluster user outside the hub
    hub = await slurm_hub(
        PROFILES, GPUHUB_CREDITS="off", extra_config="c.SlurmReservations.interval = 2\n"
    )
    tokens = {name: await hub.create_user(name) for name in (alice, bob)}
    group = f"ml101-{uuid.uuid4().hex[:6]}"
    r = await hub.api("POST", f"/groups/{group}", json={"users": [alice]})
    assert r.status_code == 201, r.text
    admin = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    made = []
    stray = "gpuhub-999999"
    foreign = f"other-{uuid.uuid4().hex[:6]}"
    try:
        # 1 GPU for the group from now+15 s for 5 min: Slurm's own reservation
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=15)
        r = await hub.api(
            "POST",
            PATH,
            token=admin,
            json={
                "group": group,
                "gpus": 1,
                "start": iso(start),
                "end": iso(start + timedelta(minutes=5)),
            },
        )
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        made.append(rid)
        name = f"gpuhub-{rid}"
        mine = slurm_reservations(slurm_cluster)[name]
        assert (mine["StartTime"], mine["EndTime"]) == (
            start.strftime("%Y-%m-%dT%H:%M:%S"),
            (start + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S"),
        )
        assert (mine["Users"], mine["NodeCnt"], mine["PartitionName"]) == (alice, "1", "gpu")

        # Slurm cannot hold a reservation the hub's own count lets through (3 more GPUs
        # while one node is held: Slurm holds whole nodes): 409 with Slurm's words, or
        # naming what it could give (22.05 may make it on the one node left, silently),
        # and nothing kept
        r = await hub.api(
            "POST",
            PATH,
            token=admin,
            json={
                "group": group,
                "gpus": 3,
                "start": iso(start),
                "end": iso(start + timedelta(minutes=5)),
            },
        )
        assert r.status_code == 409, r.text
        assert re.fullmatch(
            r"Slurm refused: Error creating the reservation: .+|Slurm can "
            r"hold only 2 GPUs \(node\d\) of partition gpu then, not 3: "
            r"the others are reserved\.",
            r.json()["message"],
        ), r.text
        r = await hub.api("GET", PATH, token=admin)
        assert [x["id"] for x in r.json()["reservations"]] == [rid]
        assert [n for n in slurm_reservations(slurm_cluster) if n.startswith("gpuhub-")] == [name]

        # the window opens: alice's job runs in Slurm's reservation, on its node
        await eventually(lambda: _active(slurm_cluster, name), 40, "the window's start")
        # Slurm may move a reservation that has not started off a node it cannot use
        reserved_node = slurm_reservations(slurm_cluster)[name]["Nodes"]
        free_node = ({"node1", "node2"} - {reserved_node}).pop()
        r = await hub.spawn(alice, {"profile": "gpu"})
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready(alice, timeout=180)
        job = job_of(slurm_cluster, alice)
        assert (job["Reservation"], job["NodeList"]) == (name, reserved_node)

        # the other node's GPUs taken by someone outside the hub
        outside = [
            slurm_cluster.run(
                "sbatch",
                "--parsable",
                "--gres=gpu:1",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 600",
                user=other,
            ).stdout.strip()
            for _ in range(2)
        ]
        slurm_cluster.wait_for(
            "the outside jobs running",
            lambda: all(slurm_cluster.job_state(j) == "RUNNING" for j in outside),
        )
        assert set(slurm_cluster.run("squeue", "-h", "-u", other, "-o", "%N").stdout.split()) == {
            free_node
        }

        # bob, not in the group: the hub refuses him in the card's words, and Slurm keeps
        # his own job pending though the reserved node has a GPU free
        r = await hub.spawn(bob, {"profile": "gpu"})
        assert r.status_code == 409, r.text
        assert f"2 GPUs reserved for {group} until " in r.json()["message"], r.text
        # the GPU board marks the reserved node's GPUs with the same words
        r = await hub.api("GET", "/gpuhub/gpus", token=admin)
        assert r.status_code == 200, r.text
        marked = {d["uuid"]: d["reserved_for"] for d in r.json()["devices"] if d["reserved_for"]}
        assert sorted(marked) == [f"{reserved_node}/gpu0", f"{reserved_node}/gpu1"], marked
        assert all(t.startswith(f"2 GPUs reserved for {group} until ") for t in marked.values()), (
            marked
        )
        pending = slurm_cluster.run(
            "sbatch",
            "--parsable",
            "--gres=gpu:1",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
            user=bob,
        ).stdout.strip()
        await _still(slurm_cluster, pending, "PENDING", seconds=8)

        # deleted in the hub: Slurm's ends at once (alice's job still in it) and bob's
        # job gets the GPU
        r = await hub.api("DELETE", f"{PATH}/{rid}", token=admin)
        assert r.status_code == 204, r.text
        made.remove(rid)
        ended = slurm_reservations(slurm_cluster).get(name)
        assert ended is None or ended["EndTime"] <= datetime.now(UTC).strftime(
            "%Y-%m-%dT%H:%M:%S"
        ), ended
        slurm_cluster.wait_for(
            "bob's job running on the freed node",
            lambda: slurm_cluster.job_state(pending) == "RUNNING",
            timeout=40,
        )
        await hub.stop_server(alice, timeout=120)
        slurm_cluster.run("scancel", pending, *outside)

        # a restarted hub: Slurm's reservations made to match the hub's own again
        later = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10)
        r = await hub.api(
            "POST",
            PATH,
            token=admin,
            json={
                "group": group,
                "gpus": 1,
                "start": iso(later),
                "end": iso(later + timedelta(minutes=5)),
            },
        )
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        made.append(rid)
        hub.kill(signal.SIGTERM)
        slurm_cluster.run("scontrol", "delete", f"ReservationName=gpuhub-{rid}")
        for extra in (stray, foreign):
            slurm_cluster.run(
                "scontrol",
                "create",
                "reservation",
                f"ReservationName={extra}",
                "StartTime=now+3600",
                "Duration=5",
                "Users=root",
                "NodeCnt=1",
                "Flags=IGNORE_JOBS",
            )
        await hub.start()
        slurm_cluster.wait_for(
            "the restarted hub's reservations in Slurm",
            lambda: (
                f"gpuhub-{rid}" in (found := slurm_reservations(slurm_cluster))
                and stray not in found
            ),
            timeout=30,
        )
        assert foreign in slurm_reservations(slurm_cluster)  # not the hub's: left alone
        assert slurm_reservations(slurm_cluster)[f"gpuhub-{rid}"]["Users"] == alice
        # a new member of the group (as a login with the group would make): a Slurm user
        # of the reservation by the next pass
        carol = slurm_cluster.fresh_member("ghs-rc")
        await hub.create_user(carol)
        r = await hub.api("POST", f"/groups/{group}/users", json={"users": [carol]})
        assert r.status_code == 200, r.text
        slurm_cluster.wait_for(
            "carol among the reservation's users",
            lambda: (
                slurm_reservations(slurm_cluster)[f"gpuhub-{rid}"]["Users"] == f"{alice},{carol}"
            ),
            timeout=15,
        )
    finally:
        for rid in made:
            await hub.api("DELETE", f"{PATH}/{rid}", token=admin)
        for extra in (stray, foreign, *(f"gpuhub-{rid}" for rid in made)):
            slurm_cluster.run("scontrol", "delete", f"ReservationName={extra}", check=False)
        del tokens


async def _active(cluster, name: str) -> bool:
    return slurm_reservations(cluster).get(name, {}).get("State") == "ACTIVE"


async def _still(cluster, job_id: str, state: str, seconds: float) -> None:
    """``job_id`` stays in ``state`` for ``seconds`` (Slurm's scheduler passes meanwhile)."""
    import asyncio

    for _ in range(int(seconds / 0.5)):
        assert cluster.job_state(job_id) == state, cluster.run("squeue").stdout
        await asyncio.sleep(0.5)
