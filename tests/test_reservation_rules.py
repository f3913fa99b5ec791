"""The reservations' pure rules (hub_ext/reservations/rules.py): what a request may say,
when a reservation occurs, and whether the hub's GPUs hold every reservation at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub_ext.reservations.rules import (
    Conflict,
    Invalid,
    Spec,
    check_capacity,
    first_conflict,
    occurrences,
    parse_spec,
    validate,
)

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
TUESDAY = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)
GROUPS = ["ml101", "ml102"]


def lab(gpus=1, group="ml101", start=TUESDAY, hours=2, id=None, **kw) -> Spec:
    return Spec(
        group=group, gpus=gpus, start=start, end=start + timedelta(hours=hours), id=id, **kw
    )


def test_a_weekly_lab_with_an_exception_occurs_every_week_but_that_one():
    spec = parse_spec(
        {
            "group": "ml101",
            "gpus": 2,
            "start": "2026-12-01T14:00:00Z",
            "end": "2026-12-01T16:00:00Z",
            "rrule": "FREQ=WEEKLY;COUNT=4",
            "exdates": ["2026-12-15T14:00:00+00:00"],
        }
    )
    validate(spec, NOW, GROUPS, capacity=2)
    assert [o.start.day for o in occurrences(spec)] == [1, 8, 22]
    assert [(o.start.hour, o.end.hour) for o in occurrences(spec)] == [(14, 16)] * 3
    # the window asks which overlap it: the one of Dec 8 ends after 15:00
    window = occurrences(
        spec,
        since=datetime(2026, 12, 8, 15, tzinfo=UTC),
        until=datetime(2026, 12, 22, 14, tzinfo=UTC),
    )
    assert [o.start.day for o in window] == [8]


def test_a_recurrence_keeps_the_wall_clock_time_of_its_zone_across_daylight_saving():
    spec = parse_spec(
        {
            "group": "ml101",
            "gpus": 1,
            "start": "2027-03-23T14:00",
            "end": "2027-03-23T15:30",
            "timezone": "Europe/Berlin",
            "rrule": "FREQ=WEEKLY;COUNT=2",
        }
    )
    validate(spec, NOW, GROUPS, capacity=1)
    # 14:00 in Berlin is 13:00 UTC in winter, 12:00 UTC after March 28
    assert [o.start.hour for o in occurrences(spec)] == [13, 12]


@pytest.mark.parametrize(
    "body, reason",
    [
        pytest.param(
            {"group": "ml1O1"},
            "No such group: 'ml1O1'. Groups include: ml101, ml102",
            id="unknown-group",
        ),
        pytest.param({"end": "2026-12-01T13:00:00Z"}, "must be after the start", id="end-before"),
        pytest.param({"end": "2026-12-01T14:00:00Z"}, "must be after the start", id="end-equal"),
        pytest.param(
            {"gpus": 3},
            "The hub has 2 GPUs; a reservation of 3 can never be met",
            id="more-gpus-than-the-hub",
        ),
        pytest.param(
            {"mig_profile": "1g.5gb", "gpus": 3},
            "The hub has 2 1g.5gb MIG slices",
            id="more-slices-than-the-hub",
        ),
        pytest.param(
            {"rrule": "FREQ=WEEKLY;BYDAY=XX;COUNT=3"}, "rrule: cannot read", id="unparsable-rrule"
        ),
        pytest.param({"rrule": "FREQ=WEEKLY"}, "a recurrence must end", id="endless-rrule"),
        pytest.param(
            {"rrule": "FREQ=HOURLY;COUNT=3"}, "FREQ must be one of DAILY, WEEKLY", id="hourly"
        ),
        pytest.param(
            {"rrule": "FREQ=WEEKLY;UNTIL=20261101T000000Z"},
            "does not occur at the start",
            id="rrule-ends-before-it-starts",
        ),
        pytest.param(
            {"rrule": "FREQ=WEEKLY;BYDAY=WE;COUNT=3"},
            "does not occur at the start",
            id="rrule-misses-the-start",
        ),
        pytest.param(
            {
                "rrule": "FREQ=WEEKLY;COUNT=2",
                "exdates": ["2026-12-01T14:00:00Z", "2026-12-08T14:00:00Z"],
            },
            "never occurs: every occurrence is in exdates",
            id="all-excepted",
        ),
        pytest.param(
            {"exdates": ["2026-12-02T14:00:00Z"]},
            "is not one of the reservation's",
            id="stray-exception",
        ),
        pytest.param(
            {"rrule": "FREQ=DAILY;COUNT=3", "end": "2026-12-02T16:00:00Z"},
            "The occurrences overlap",
            id="self-overlap",
        ),
        pytest.param(
            {"start": "2026-11-01T14:00:00Z", "end": "2026-11-01T16:00:00Z"},
            "never occurs after now",
            id="in-the-past",
        ),
        pytest.param(
            {"rrule": "FREQ=DAILY;COUNT=1001"}, "more than 1000 times", id="too-many-occurrences"
        ),
    ],
)
def test_a_reservation_that_cannot_be_met_is_refused_with_the_reason(body, reason):
    full = {
        "group": "ml101",
        "gpus": 1,
        "start": "2026-12-01T14:00:00Z",
        "end": "2026-12-01T16:00:00Z",
        **body,
    }
    with pytest.raises(Invalid, match=reason.replace(".", r"\.").replace("(", r"\(")):
        validate(parse_spec(full), NOW, GROUPS, capacity=2)


@pytest.mark.parametrize(
    "body, reason",
    [
        pytest.param({"gpu": 1}, "Unknown field(s): gpu", id="unknown-field"),
        pytest.param({"gpus": "2"}, "gpus must be a whole number", id="gpus-text"),
        pytest.param({"gpus": 0}, "gpus must be a whole number from 1 up", id="gpus-zero"),
        pytest.param({"gpus": True}, "gpus must be a whole number", id="gpus-bool"),
        pytest.param(
            {"start": "next tuesday"}, "start: 'next tuesday' is not an ISO 8601", id="start-words"
        ),
        pytest.param({"timezone": "Mars/Olympus"}, "no such time zone", id="bad-zone"),
        pytest.param({"group": None}, "Missing: group", id="no-group"),
        pytest.param({"exdates": "2026-12-08"}, "exdates must be a list", id="exdates-text"),
    ],
)
def test_a_malformed_request_is_refused_before_any_rule(body, reason):
    full = {
        "group": "ml101",
        "gpus": 1,
        "start": "2026-12-01T14:00:00Z",
        "end": "2026-12-01T16:00:00Z",
        **body,
    }
    with pytest.raises(Invalid, match=reason.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(full)


def test_an_edit_changes_only_the_fields_given():
    base = lab(gpus=1, id=7, note="lab", rrule="FREQ=WEEKLY;COUNT=3")
    edited = parse_spec({"gpus": 2}, base)
    assert edited == lab(gpus=2, id=7, note="lab", rrule="FREQ=WEEKLY;COUNT=3")


def test_overlap_beyond_capacity_names_the_other_reservation_the_time_and_the_numbers():
    ml102 = lab(gpus=1, group="ml102", id=3, start=TUESDAY + timedelta(hours=1))
    with pytest.raises(Conflict) as refused:
        check_capacity(lab(gpus=2), [ml102], capacity=2, now=NOW)
    assert str(refused.value) == (
        "Not enough GPUs at Tue 2026-12-01 15:00 UTC: this reservation needs 2 and "
        "reservation 3 (ml102, 1 GPU, Tue 2026-12-01 15:00 UTC to Tue 2026-12-01 17:00 UTC) "
        "holds 1 then; the hub has 2."
    )
    assert refused.value.others == [3]
    # touching windows do not overlap; MIG slices are counted apart from whole GPUs
    check_capacity(lab(gpus=2), [lab(gpus=1, id=3, start=TUESDAY + timedelta(hours=2))], 2, NOW)
    check_capacity(lab(gpus=2), [lab(gpus=2, id=3, mig_profile="1g.5gb")], 2, NOW)
    # an edit is not in conflict with itself
    check_capacity(lab(gpus=2, id=3), [lab(gpus=2, id=3)], 2, NOW)


def test_a_conflict_names_another_groups_reservation_only_to_those_who_may_see_it():
    """An instructor of ml101 gets 404 for ml102's reservation 3: the 409 says how many GPUs
    are left, during their own occurrence, and names no group, number of GPUs or times of
    ml102's."""
    ml102 = lab(gpus=1, group="ml102", id=3, start=TUESDAY + timedelta(hours=1))
    conflict = first_conflict(lab(gpus=2), [ml102], capacity=2, now=NOW)
    assert conflict.told_to(None) == str(conflict)  # an admin: every name
    assert conflict.told_to({"ml101", "ml102"}) == str(conflict)
    hidden = conflict.told_to({"ml101"})
    assert hidden == (
        "Not enough GPUs from Tue 2026-12-01 14:00 UTC to Tue 2026-12-01 16:00 UTC: this "
        "reservation needs 2 and other reservations leave 1 free then; the hub has 2. Ask an "
        "admin, who sees every reservation."
    )
    assert "ml102" not in hidden and "15:00" not in hidden and "reservation 3" not in hidden


def test_a_weekly_reservation_conflicts_in_the_week_it_meets_another():
    weekly = lab(gpus=1, id=1, rrule="FREQ=WEEKLY;COUNT=6")
    once = lab(gpus=1, id=2, start=TUESDAY + timedelta(weeks=3, minutes=30))
    conflict = first_conflict(
        lab(gpus=1, start=TUESDAY + timedelta(weeks=3)), [weekly, once], capacity=2, now=NOW
    )
    assert conflict is not None and conflict.others == [1, 2]
    assert conflict.when == TUESDAY + timedelta(weeks=3, minutes=30)
    # that week excepted, it fits
    spared = lab(gpus=1, id=1, rrule="FREQ=WEEKLY;COUNT=6", exdates=(TUESDAY + timedelta(weeks=3),))
    assert (
        first_conflict(
            lab(gpus=1, start=TUESDAY + timedelta(weeks=3)), [spared, once], capacity=2, now=NOW
        )
        is None
    )


windows = st.tuples(st.integers(0, 48), st.integers(1, 12), st.integers(1, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(windows, max_size=6), windows, st.integers(1, 5))
def test_the_capacity_check_agrees_with_counting_every_hour(existing, new, capacity):
    """Against a brute force over whole hours (every window starts and ends on one):
    a conflict is found exactly when some hour needs more than ``capacity``."""

    def spec(w, id=None):
        start, hours, gpus = w
        return lab(gpus=gpus, start=TUESDAY + timedelta(hours=start), hours=hours, id=id)

    others = [spec(w, id=i + 1) for i, w in enumerate(existing)]
    mine = spec(new)
    load = {}
    for s in [*others, mine]:
        for h in range(int((s.end - s.start) / timedelta(hours=1))):
            t = s.start + timedelta(hours=h)
            load[t] = load.get(t, 0) + s.gpus
    mine_hours = {mine.start + timedelta(hours=h) for h in range(new[1])}
    over = sorted(t for t in mine_hours if load[t] > capacity)
    conflict = first_conflict(mine, others, capacity, NOW)
    assert (conflict is not None) == bool(over)
    if conflict:
        assert conflict.when == over[0]


class TwoGPUsOneSplit:
    """A backend as the spawn page's seam shows it: 2 whole GPUs, 1 GPU split into three
    1g.5gb MIG slices, the third slice unhealthy."""

    @classmethod
    async def availability(cls, config, log) -> dict:
        return {"total": 2, "error": ""}

    @classmethod
    async def gpu_board(cls, handler) -> dict:
        return {
            "error": "",
            "devices": [
                {"mig_profile": None},
                {"mig_profile": None},
                *({"mig_profile": "1g.5gb", "state": s} for s in ("free", "held", "unhealthy")),
            ],
        }


class InventoryDown(TwoGPUsOneSplit):
    @classmethod
    async def availability(cls, config, log) -> dict:
        return {"total": 0, "error": "NVML cannot be read"}


async def test_the_hub_capacity_comes_from_the_backend_whole_gpus_and_slices_apart():
    import logging
    from types import SimpleNamespace

    from hub_ext.reservations.capacity import CapacityUnknown, hub_capacity

    def handler(backend):
        return SimpleNamespace(
            settings={"spawner_class": backend, "config": {}}, log=logging.getLogger("test")
        )

    assert await hub_capacity(handler(TwoGPUsOneSplit)) == 2
    assert await hub_capacity(handler(TwoGPUsOneSplit), "1g.5gb") == 3
    assert await hub_capacity(handler(TwoGPUsOneSplit), "3g.20gb") == 0
    with pytest.raises(CapacityUnknown, match="NVML cannot be read"):
        await hub_capacity(handler(InventoryDown))
