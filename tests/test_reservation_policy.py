"""The rules of an enforced reservation (hub_ext.reservations.policy), without a hub."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.reservations.policy import (
    Holding,
    closed_units,
    due,
    open_at,
    reason,
    runs_into,
    starts_text,
    stop_at,
    to_stop,
    windows,
)
from hub_ext.reservations.rules import Spec

T = datetime(2027, 1, 12, 14, 0, tzinfo=UTC)
LAB = Spec(group="ml101", gpus=1, start=T, end=T + timedelta(hours=2), id=1)


def at(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def held(user, since, groups=(), count=1, units="gpu"):
    return Holding((user, ""), user, units, count, since, frozenset(groups))


def free(n):
    return lambda units: n


def test_a_window_is_open_from_its_start_to_its_end_and_named_for_people():
    found = windows([LAB], at(-30), at(180), label=lambda g: g.upper())
    assert [(w.group, w.label, w.gpus) for w in found] == [("ml101", "ML101", 1)]
    assert open_at(found, at(-1)) == []
    assert open_at(found, at(0)) == found
    assert open_at(found, at(120)) == []  # the end is not in it
    assert reason([(found[0], 1)]) == "1 GPU reserved for ML101 until 16:00 UTC"


def test_weekly_windows_keep_their_wall_clock_time_in_the_reservations_zone():
    berlin = Spec(
        group="ml101",
        gpus=2,
        start=T,
        end=T + timedelta(hours=2),
        id=2,
        timezone="Europe/Berlin",
        rrule="FREQ=WEEKLY;COUNT=3",
    )
    found = windows([berlin], at(7 * 24 * 60), at(8 * 24 * 60))
    assert len(found) == 1
    assert reason([(found[0], 2)]) == "2 GPUs reserved for ml101 until 17:00 CET"


@pytest.mark.parametrize(
    "groups, holdings, closed",
    [
        pytest.param({"ml102"}, [], 1, id="a non-member finds the reserved GPU closed"),
        pytest.param({"ml101"}, [], 0, id="a member finds it open"),
        pytest.param(
            set(),
            [held("bob", 1.0, {"ml101"})],
            0,
            id="a member's server from before the window counts inside it",
        ),
        pytest.param(
            set(), [held("eve", 1.0)], 1, id="a non-member's server does not count inside it"
        ),
    ],
)
def test_units_closed_to_a_member(groups, holdings, closed):
    found = open_at(windows([LAB], at(0), at(1)), at(0))
    assert closed_units(found, groups, "gpu", holdings)[0] == closed
    assert closed_units(found, groups, "1g.5gb", holdings)[0] == 0  # other kinds open


def test_a_free_gpu_is_used_before_anyone_is_stopped():
    found = open_at(windows([LAB], at(0), at(1)), at(0))
    assert to_stop(found, [held("eve", 1.0), held("dan", 2.0)], free(1)) == []


def test_only_as_many_as_the_window_needs_are_stopped_the_latest_first():
    two = Spec(group="ml101", gpus=2, start=T, end=T + timedelta(hours=2), id=3)
    found = open_at(windows([two], at(0), at(1)), at(0))
    holdings = [
        held("eve", 1.0),
        held("dan", 3.0),
        held("amy", 2.0),
        held("bob", 4.0, {"ml101"}),
    ]  # bob's GPU counts for the group
    stopped = to_stop(found, holdings, free(0))
    assert [h.user for h, _ in stopped] == ["dan"]
    assert to_stop(found, holdings[:3], free(0))[1][0].user == "amy"


def test_the_warning_names_whom_a_window_starting_soon_will_stop():
    found = windows([LAB], at(-10), at(10))
    holdings = [held("eve", 1.0), held("dan", 2.0)]
    assert list(due(found, holdings, free(0), at(-10), ahead=900)) == [("dan", "")]
    assert due(found, holdings, free(0), at(-20), ahead=900) == {}  # not yet
    assert due(found, holdings, free(1), at(-10), ahead=900) == {}  # a free one will do


def test_a_start_is_told_of_the_next_window_of_another_group():
    found = windows([LAB], at(-60), at(600))
    assert runs_into(found, set(), "gpu", at(-60)).start == T
    assert runs_into(found, {"ml101"}, "gpu", at(-60)) is None
    assert runs_into(found, set(), "gpu", at(1)) is None  # started already


def test_sentences_carry_the_date_of_a_window_of_several_days():
    """Issue 28: a 30-day window read "from 22:34 UTC to 22:34 UTC"."""
    month = Spec(group="ml101", gpus=2, start=T, end=T + timedelta(days=30), id=4)
    [window] = windows([month], at(0), at(1))
    assert starts_text(window) == (
        "2 GPUs are reserved for ml101 from Tue 2027-01-12 14:00 UTC to Thu 2027-02-11 14:00 UTC"
    )
    assert reason([(window, 2)]) == "2 GPUs reserved for ml101 until Thu 2027-02-11 14:00 UTC"
    # a window of one afternoon names its day once
    [afternoon] = windows([LAB], at(0), at(1))
    assert starts_text(afternoon) == (
        "1 GPU is reserved for ml101 from Tue 2027-01-12 14:00 UTC to 16:00 UTC"
    )


def test_the_date_is_the_reservations_zones():
    """23:30 to 01:00 UTC on Jan 12 is 00:30 to 02:00 in Berlin on Jan 13: one day there."""
    night = Spec(
        group="ml101",
        gpus=1,
        start=T + timedelta(hours=9, minutes=30),
        end=T + timedelta(hours=11),
        id=5,
        timezone="Europe/Berlin",
    )
    [window] = windows([night], at(0), at(24 * 60))
    assert starts_text(window) == (
        "1 GPU is reserved for ml101 from Wed 2027-01-13 00:30 CET to 02:00 CET"
    )


@pytest.mark.parametrize(
    "made, since, warned, stop",
    [
        pytest.param(
            at(-60), at(-120), at(-15), at(0), id="warned-the-warning-time-before-the-start"
        ),
        pytest.param(
            at(0), at(-120), at(0), at(15), id="a-window-made-to-begin-now-waits-for-the-warning"
        ),
        pytest.param(
            at(-5), at(-120), at(-5), at(10), id="made-within-the-warning-time-ends-it-later"
        ),
        pytest.param(
            at(-60), at(-10), at(0), at(0), id="started-after-the-warning-was-up-told-at-its-start"
        ),
        pytest.param(
            at(-60), at(30), at(30), at(45), id="started-inside-the-window-warned-when-chosen"
        ),
    ],
)
def test_a_server_is_never_stopped_before_its_warning(made, since, warned, stop):
    """``stop_at`` with a 15-minute warning, for the lab of 14:00 (``at(0)``)."""
    [window] = windows([LAB], at(0), at(1), made=lambda _: made)
    assert stop_at(window, since.timestamp(), warned, 900) == stop
