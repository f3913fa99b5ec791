"""The pure parts of Slurm's reservations (hub_ext/slurm/reservations.py): reading
``scontrol -o show reservation``, what a hub reservation asks of Slurm, what changes."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.reservations.backend import BackendRefused
from hub_ext.reservations.rules import Spec
from hub_ext.slurm.cluster import Node
from hub_ext.slurm.reservations import (
    closed_gpus,
    create_args,
    hub_id,
    nodes_needed,
    parse_reservations,
    slurm_name,
    until_text,
    update_args,
    wanted,
)

# Slurm 22.05's own line (the test cluster, TZ=UTC)
LINE = (
    "ReservationName=gpuhub-7 StartTime=2026-11-26T11:13:32 EndTime=2026-11-26T11:23:33 "
    "Duration=00:10:01 Nodes=node[1-2] NodeCnt=2 CoreCnt=4 Features=(null) "
    "PartitionName=gpu Flags=FLEX,IGNORE_JOBS TRES=cpu=4 Users=alice,bob Groups=(null) "
    "Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a "
    "MaxStartDelay=(null)"
)
T0 = datetime(2026, 12, 1, 14, tzinfo=UTC)


def test_scontrol_show_reservation_is_read_with_its_nodes_users_and_times():
    found = parse_reservations(LINE + "\nNo reservations in the system\n")
    r = found["gpuhub-7"]
    assert (r.start, r.end) == (
        datetime(2026, 11, 26, 11, 13, 32, tzinfo=UTC),
        datetime(2026, 11, 26, 11, 23, 33, tzinfo=UTC),
    )
    assert (r.nodes, r.users, r.partition, r.active) == (
        ("node1", "node2"),
        ("alice", "bob"),
        "gpu",
        True,
    )


@pytest.mark.parametrize(
    ("gpus", "nodes", "needed"),
    [
        pytest.param(1, [2, 2], 1, id="one-gpu-one-node"),
        pytest.param(3, [2, 2], 2, id="three-gpus-two-nodes"),
        pytest.param(3, [8, 2, 2], 2, id="whichever-nodes-slurm-picks"),
        pytest.param(5, [2, 2], 0, id="more-than-the-partition"),
    ],
)
def test_whole_nodes_hold_the_gpus_whichever_slurm_picks(gpus, nodes, needed):
    assert nodes_needed(gpus, nodes) == needed


def test_the_next_occurrence_of_a_weekly_lab_is_what_slurm_holds():
    spec = Spec(
        group="ml101",
        gpus=1,
        start=T0,
        end=T0 + timedelta(hours=2),
        rrule="FREQ=WEEKLY;COUNT=3",
        id=4,
    )
    w = wanted(spec, T0 + timedelta(days=1), ["bob", "alice"], [2, 2], "gpu")
    assert (w.name, w.start, w.end, w.users) == (
        "gpuhub-4",
        T0 + timedelta(days=7),
        T0 + timedelta(days=7, hours=2),
        ("alice", "bob"),
    )
    assert create_args(w) == [
        "scontrol",
        "create",
        "reservation",
        "ReservationName=gpuhub-4",
        "StartTime=2026-12-08T14:00:00",
        "EndTime=2026-12-08T16:00:00",
        "Users=alice,bob",
        "PartitionName=gpu",
        "NodeCnt=1",
        "Flags=FLEX,IGNORE_JOBS",
    ]
    assert wanted(spec, T0 + timedelta(days=30), ["alice"], [2, 2], "gpu") is None
    with pytest.raises(BackendRefused, match="cannot hold 5"):
        wanted(
            Spec(group="g", gpus=5, start=T0, end=T0 + timedelta(hours=1), id=1),
            T0,
            ["a"],
            [2, 2],
            "gpu",
        )


def test_two_hubs_on_one_cluster_name_their_reservations_apart():
    assert (slurm_name(7), slurm_name(7, "gpuhub"), slurm_name(7, "lab2")) == (
        "gpuhub-7",
        "gpuhub-7",
        "gpuhub-lab2-7",
    )
    assert (hub_id("gpuhub-7"), hub_id("gpuhub-lab2-7", "lab2")) == (7, 7)
    # neither takes the other's for its own (its pass would delete it)
    assert (hub_id("gpuhub-lab2-7"), hub_id("gpuhub-7", "lab2")) == (None, None)
    assert hub_id("gpuhub-lab2-7", "lab") is None
    spec = Spec(group="g", gpus=1, start=T0, end=T0 + timedelta(hours=1), id=3)
    assert wanted(spec, T0, ["a"], [2, 2], "gpu", "lab2").name == "gpuhub-lab2-3"


def test_an_update_changes_users_and_times_but_not_a_running_start():
    [have] = parse_reservations(LINE).values()
    spec = Spec(group="g", gpus=1, start=have.start, end=have.end, id=7)
    same = wanted(spec, have.start, ["alice", "bob"], [2, 2], "gpu")
    assert update_args(same, have) is None
    # a window open when it was made: Slurm started it then, not at the hub's start
    late = replace(have, start=have.start + timedelta(seconds=2))
    assert update_args(same, late) is None
    assert update_args(same, replace(late, state="INACTIVE")) is not None
    joined = wanted(spec, have.start, ["alice", "bob", "carol"], [2, 2], "gpu")
    assert update_args(joined, have) == [
        "scontrol",
        "update",
        "ReservationName=gpuhub-7",
        "EndTime=2026-11-26T11:23:33",
        "Users=alice,bob,carol",
    ]


def test_a_non_member_sees_the_reserved_nodes_gpus_taken():
    nodes = [
        Node("node1", ["gpu"], "mixed", {"": 2}, {"": 1}),
        Node("node2", ["gpu"], "idle", {"": 2}, {}),
    ]
    [r] = parse_reservations(LINE.replace("node[1-2]", "node1")).values()
    r = replace(r, reservation_id=7)  # the hub's own (SlurmReservations.read)
    seen, why = closed_gpus(nodes, [r], lambda r: False)
    assert ([n.free() for n in seen], why) == ([0, 2], r)
    seen, why = closed_gpus(nodes, [r], lambda r: True)
    assert ([n.free() for n in seen], why) == ([1, 2], None)


def test_the_cards_words_carry_the_end_date_of_a_reservation_of_several_days():
    nodes = [Node("node1", ["gpu"], "mixed", {"": 2}, {"": 1})]
    [r] = parse_reservations(LINE.replace("node[1-2]", "node1")).values()
    assert until_text(r, "ml101", nodes) == "2 GPUs reserved for ml101 until 11:23 UTC"
    month = replace(r, end=r.start + timedelta(days=30))
    assert until_text(month, "ml101", nodes) == (
        "2 GPUs reserved for ml101 until Sat 2026-12-26 11:13 UTC"
    )


@pytest.mark.slurm
async def test_slurms_no_is_told_from_slurm_not_answering(slurm_cluster, tmp_path):
    """The real scontrol: a user Slurm does not know is Slurm's no (409 in the API); a
    controller that does not answer (its port closed) is not (503)."""
    from hub_ext.reservations.backend import BackendUnavailable
    from hub_ext.slurm.cluster import SlurmCluster
    from hub_ext.slurm.reservations import SlurmReservations

    ask = [
        "scontrol",
        "create",
        "reservation",
        "ReservationName=gpuhub-999998",
        "StartTime=now+3600",
        "Duration=5",
        "Users=ghs-no-such-user",
        "NodeCnt=1",
    ]
    runner = SlurmReservations(SlurmCluster(env=slurm_cluster.env))
    with pytest.raises(BackendRefused, match="Slurm refused: .*Invalid user id"):
        await runner.run(*ask)
    conf = (slurm_cluster.dir / "slurm.conf").read_text()
    # the controller's port closed, whichever the cluster uses (GPUHUB_SLURM_PORT)
    (tmp_path / "slurm.conf").write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=9", conf))
    down = SlurmReservations(
        SlurmCluster(env={"SLURM_CONF": str(tmp_path / "slurm.conf")}, timeout=30)
    )
    with pytest.raises(BackendUnavailable):
        await down.run(*ask)
