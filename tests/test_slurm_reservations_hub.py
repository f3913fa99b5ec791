"""Reservations on the Slurm backend are Slurm's own: a real hub and proxy, the real two-node
test cluster (tests/fixtures/slurm.py, 2 stand-in GPUs per node), members' jobs under their
own uids.  The hub's reservation becomes ``gpuhub-<hub id>-<id>`` in ``scontrol show
reservation`` (the test hubs' ``GPUHUB_HUB_ID`` is not the default);
a member's job during the window runs in it; a non-member is refused by the hub and kept
pending by Slurm while the other GPUs are taken; deleting it in the hub ends Slurm's; a
restarted hub makes Slurm's match its own again.  Slurm leaves a job that already runs on
the reserved node alone: the hub warns a non-member's server there and stops it at the
window's start (refunded, reason ``reservation``), and a member's server there is paid by
the course's account (the reference credits service)."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import MEMBERS
from tests.test_reservation_enforcement_hub import home, last_run, page_says, span, until
from tests.test_slurm_hub import events_until

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


def outside_job(cluster, user: str) -> str:
    """A one-GPU batch job of ``user`` submitted outside the hub (``sleep 600``); its id."""
    return cluster.run(
        "sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600", user=user
    ).stdout.strip()


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
    stray = f"gpuhub-{hub.id}-999999"  # named as this hub names its own
    foreign = "gpuhub-999998"  # as a hub with the default GPUHUB_HUB_ID names its own
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
        name = f"gpuhub-{hub.id}-{rid}"
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
        assert [
            n for n in slurm_reservations(slurm_cluster) if n.startswith(f"gpuhub-{hub.id}-")
        ] == [name]

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
        outside = [outside_job(slurm_cluster, other) for _ in range(2)]
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
        pending = outside_job(slurm_cluster, bob)
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
        slurm_cluster.run("scontrol", "delete", f"ReservationName=gpuhub-{hub.id}-{rid}")
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
                f"gpuhub-{hub.id}-{rid}" in (found := slurm_reservations(slurm_cluster))
                and stray not in found
            ),
            timeout=30,
        )
        assert foreign in slurm_reservations(slurm_cluster)  # not the hub's: left alone
        assert slurm_reservations(slurm_cluster)[f"gpuhub-{hub.id}-{rid}"]["Users"] == alice
        # a new member of the group (as a login with the group would make): a Slurm user
        # of the reservation by the next pass
        carol = slurm_cluster.fresh_member("ghs-rc")
        await hub.create_user(carol)
        r = await hub.api("POST", f"/groups/{group}/users", json={"users": [carol]})
        assert r.status_code == 200, r.text
        slurm_cluster.wait_for(
            "carol among the reservation's users",
            lambda: (
                slurm_reservations(slurm_cluster)[f"gpuhub-{hub.id}-{rid}"]["Users"]
                == f"{alice},{carol}"
            ),
            timeout=15,
        )
    finally:
        for rid in made:
            await hub.api("DELETE", f"{PATH}/{rid}", token=admin)
        for extra in (stray, foreign, *(f"gpuhub-{hub.id}-{rid}" for rid in made)):
            slurm_cluster.run("scontrol", "delete", f"ReservationName={extra}", check=False)
        del tokens


async def _active(cluster, name: str) -> bool:
    return slurm_reservations(cluster).get(name, {}).get("State") == "ACTIVE"


async def _still(cluster, job_id: str, state: str, seconds: float) -> None:
    """``job_id`` stays in ``state`` for ``seconds`` (Slurm's scheduler passes meanwhile)."""
    for _ in range(int(seconds / 0.5)):
        assert cluster.job_state(job_id) == state, cluster.run("squeue").stdout
        await asyncio.sleep(0.5)


PRICED = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
]


async def test_a_non_members_job_on_the_reserved_node_is_stopped_and_the_course_pays(
    slurm_hub, slurm_cluster, credits_service, ledger_admin, tmp_path
):
    bob = slurm_cluster.fresh_member("ghs-rb")  # not in the course: on the node to reserve
    carol = slurm_cluster.fresh_member("ghs-rc")  # not in it either: on the other node
    alice = slurm_cluster.fresh_member("ghs-ra")  # in it
    other = slurm_cluster.fresh_member("ghs-ro")  # a cluster user outside the hub
    group, account = f"ml101-{uuid.uuid4().hex[:6]}", f"{alice}-ml101"
    courses = tmp_path / "courses.json"
    courses.write_text(
        json.dumps(
            {
                "ml101": {
                    "display_name": "ML101",
                    "group": group,
                    "instructors": ["ml101-instructors"],
                    "account": account,
                }
            }
        )
    )
    # bob's server starts only once the test opens a gate (the reservation made onto his
    # node while his server starts: Slurm keeps a job off a node reserved later)
    gate = slurm_cluster.shared / f"gate-{bob}"
    hold_bob = (
        f'bash -c \'[ "$(id -un)" != {bob} ] || until [ -e {gate} ]; do sleep 0.2; done; '
        'exec "$@"\' hold-bob '
    )
    hub = await slurm_hub(
        PRICED,
        "c.Reservations.check_interval = 1\n"
        "from hub_ext.slurm.batch import BWRAP\n"
        f"c.GPUSlurmSpawner.container_command = {hold_bob!r} + BWRAP\n",
        GPUHUB_CREDITS_URL=credits_service.url,
        GPUHUB_CREDITS_TOKEN=credits_service.hub_token,
        GPUHUB_COURSES=str(courses),
        GPUHUB_RESERVATION_WARNING="60",
    )
    browsers = {
        alice: await hub.login(alice, groups=[MEMBERS, group]),
        bob: await hub.login(bob),
        carol: await hub.login(carol),
    }
    for name in (alice, bob, carol):
        await ledger_admin.grant(name, "10.00", key=f"test-grant-{name}")
    await ledger_admin.grant(account, "0.50", key=f"test-grant-{account}")  # not enough
    admin = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    rid = None
    try:
        r = await hub.spawn(bob, {"profile": "gpu"})
        assert r.status_code == 202, r.text
        node = slurm_cluster.wait_for(
            "bob's job running",
            lambda: (
                (job := job_of(slurm_cluster, bob)).get("JobState") == "RUNNING" and job["NodeList"]
            ),
        )
        # 1 GPU for the course from 90 s from now for 3 minutes, on bob's node
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=90)
        end = start + timedelta(minutes=3)
        rid = await reserve_on(hub, slurm_cluster, node, group, start, end)
        window = f"2 GPUs are reserved for ML101 {span(start.timestamp(), end.timestamp())}"
        # bob is warned on his home page while his server starts (Slurm holds the node's 2
        # GPUs), a minute before the start, and his start's progress says until when it
        # may run
        await eventually(
            lambda: page_says(browsers[bob], f"{window}, and it holds a GPU they need."),
            timeout=60,
            what="the warning on bob's home page",
        )
        told = asyncio.ensure_future(
            events_until(hub, bob, f"{window}: this server may run until then", timeout=180)
        )
        await asyncio.sleep(0.5)  # the progress stream open before his start ends
        gate.touch()
        await told
        await hub.wait_ready(bob, timeout=180)
        # carol's job cannot run into the reservation: the other node, and not told
        await _ready(hub, carol)
        assert job_of(slurm_cluster, carol)["NodeList"] != node
        assert f"{carol} runs on" not in hub.log()
        # the other node full: the course's jobs go to the reserved one
        outside = outside_job(slurm_cluster, other)

        # carol is not warned
        assert "will be stopped" not in await home(browsers[carol])

        # the window's start: the hub stops bob's job (Slurm would not), refunds the rest of
        # his paid interval and says why; carol's server on the other node runs on
        await eventually(lambda: hub.stopped(bob), timeout=150, what="bob's server stopped")
        assert slurm_cluster.run("squeue", "-h", "-u", bob, "-t", "R").stdout.strip() == ""
        assert await hub.running(carol)
        run = last_run(hub, bob)
        assert (run.stop_reason, run.stop_detail) == (
            "reservation",
            f"{window}, and your server held a GPU they need",
        )
        assert f"Your server was stopped: {window}" in await home(browsers[bob])
        paid = await eventually(lambda: _refunded(ledger_admin, bob), what="bob's refund")
        assert paid[:2] == [("grant", "10.00"), ("debit", "1.00")], paid
        assert len(paid) == 3 and 0 < float(paid[2][1]) < 1, paid

        # alice's card says the course pays; its account cannot: she is told, and may pay
        # herself
        await eventually(
            lambda: _spawn_page_says(
                browsers[alice],
                f"Paid by ML101 during its reservation until "
                f"{until(start.timestamp(), end.timestamp())}",
            ),
            what="alice's card",
        )
        await _refused(
            hub,
            slurm_cluster,
            alice,
            "ML101's account cannot pay for this server: it has 0.50 credits",
        )
        await _ready(hub, alice, pay="self")
        assert last_run(hub, alice).course is None
        await hub.stop_server(alice, timeout=120)
        own = await _ledger(ledger_admin, alice)
        assert [k for k, _, _ in own] == ["grant", "debit", "refund"], own

        # with credits, the course's account pays for her job, which runs in the
        # reservation, on its node; the debit names her and the course
        await ledger_admin.grant(account, "10.00", key=f"test-grant-more-{account}")
        await _ready(hub, alice)
        job = job_of(slurm_cluster, alice)
        assert (job["Reservation"], job["NodeList"]) == (f"gpuhub-{hub.id}-{rid}", node), job
        course = await _ledger(ledger_admin, account)
        assert [(k, a) for k, a, _ in course] == [
            ("grant", "0.50"),
            ("grant", "10.00"),
            ("debit", "1.00"),
        ], course
        assert (course[2][2]["member"], course[2][2]["course"]) == (alice, "ml101"), course
        assert await _ledger(ledger_admin, alice) == own
        assert last_run(hub, alice).course == "ml101"
        await hub.stop_server(alice, timeout=120)
        day = datetime.now(UTC)
        by_course = subprocess.run(
            [
                sys.executable,
                "-m",
                "hub_ext.cli",
                "usage",
                "--by",
                "course",
                "--csv",
                "--since",
                f"{day - timedelta(days=1):%Y-%m-%d}",
                "--until",
                f"{day + timedelta(days=1):%Y-%m-%d}",
            ],
            capture_output=True,
            text=True,
            env=hub.env,
            cwd=hub.tmp,
        )
        assert by_course.returncode == 0, by_course.stderr
        assert by_course.stdout.splitlines()[1].startswith("ml101,1,"), by_course.stdout
        slurm_cluster.run("scancel", outside)
    finally:
        gate.unlink(missing_ok=True)
        if rid is not None:
            await hub.api("DELETE", f"{PATH}/{rid}", token=admin)
            slurm_cluster.run(
                "scontrol", "delete", f"ReservationName=gpuhub-{hub.id}-{rid}", check=False
            )


async def test_a_window_that_begins_at_once_warns_a_non_members_job_before_it_stops_it(
    slurm_hub, slurm_cluster
):
    """Issue 28 on Slurm: a reservation from now for 30 days on the node of bob's running
    server (bob is not in the group).  Slurm leaves his job running (IGNORE_JOBS); the hub
    warns him at once, with the dates, and stops it only when the warning time (here 20 s)
    is up."""
    bob = slurm_cluster.fresh_member("ghs-rb")
    hub = await slurm_hub(
        PROFILES,
        "c.Reservations.check_interval = 0.5\n",
        GPUHUB_CREDITS="off",
        GPUHUB_RESERVATION_WARNING="20",
    )
    browser = await hub.login(bob)
    group = f"ml101-{uuid.uuid4().hex[:6]}"
    r = await hub.api("POST", f"/groups/{group}")
    assert r.status_code == 201, r.text
    admin = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    rid = None
    try:
        await _ready(hub, bob)
        node = job_of(slurm_cluster, bob)["NodeList"]
        start = datetime.now(UTC).replace(microsecond=0)
        end = start + timedelta(days=30)
        rid = await reserve_on(hub, slurm_cluster, node, group, start, end)
        assert slurm_reservations(slurm_cluster)[f"gpuhub-{hub.id}-{rid}"]["State"] == "ACTIVE"
        window = f"2 GPUs are reserved for {group} {span(start.timestamp(), end.timestamp())}"
        warning = re.compile(
            rf"Your server will be stopped in about (\d+) s: {re.escape(window)}, and it holds "
            "a GPU they need."
        )

        async def seconds_left() -> int | None:
            found = warning.search(html.unescape(await home(browser)))
            return int(found[1]) if found else None

        left = await eventually(seconds_left, what="the warning on bob's home page")
        warned = time.monotonic()
        assert 15 <= left <= 20, left
        await asyncio.sleep(10)  # twenty passes
        assert await hub.running(bob)
        await eventually(lambda: hub.stopped(bob), timeout=60, what="bob's server stopped")
        assert time.monotonic() - warned >= 15
        run = last_run(hub, bob)
        assert (run.stop_reason, run.stop_detail) == (
            "reservation",
            f"{window}, and your server held a GPU they need",
        )
        assert f"Your server was stopped: {window}" in await home(browser)
    finally:
        if rid is not None:
            await hub.api("DELETE", f"{PATH}/{rid}", token=admin)
            slurm_cluster.run(
                "scontrol", "delete", f"ReservationName=gpuhub-{hub.id}-{rid}", check=False
            )


async def reserve_on(hub, cluster, node: str, group: str, start, end) -> int:
    """1 GPU for ``group`` from ``start`` to ``end``, made by an admin; Slurm picks the
    node, which is then pinned on ``node`` (Slurm may pick it: a reservation ignores
    running jobs).  Its id."""
    admin = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    r = await hub.api(
        "POST",
        PATH,
        token=admin,
        json={"group": group, "gpus": 1, "start": iso(start), "end": iso(end)},
    )
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    cluster.run("scontrol", "update", f"ReservationName=gpuhub-{hub.id}-{rid}", f"Nodes={node}")
    return rid


async def _ready(hub, name: str, **options) -> None:
    r = await hub.spawn(name, {"profile": "gpu", **options})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name, timeout=180)


async def _refused(hub, cluster, name: str, text: str) -> None:
    """``name``'s start is refused with ``text``: at once (HTTP 402), or, when the job ran
    after the hub answered 202, in the start's progress; nothing is left running."""
    r = await hub.spawn(name, {"profile": "gpu"})
    if r.status_code == 202:
        await events_until(hub, name, text, timeout=180)
        await eventually(lambda: hub.stopped(name), what=f"{name}'s failed start cleared")
    else:
        assert r.status_code == 402 and text in r.json()["message"], r.text
    cluster.wait_for(
        f"{name}'s job cancelled",
        lambda: not cluster.run("squeue", "-h", "-u", name, "-t", "PD,R").stdout.strip(),
        timeout=30,
    )


async def _ledger(admin, account: str) -> list[tuple[str, str, dict]]:
    return [
        (t.kind, str(t.amount), dict(t.metadata)) async for t in admin.iter_transactions(account)
    ][::-1]


async def _spawn_page_says(browser, text: str) -> bool:
    r = await browser.get("/hub/spawn")
    assert r.status_code == 200, r.text[:300]
    return text in r.text


async def _refunded(admin, name: str) -> list[tuple[str, str]]:
    found = [(t.kind, str(t.amount)) async for t in admin.iter_transactions(name)][::-1]
    return found if any(k == "refund" for k, _ in found) else []
