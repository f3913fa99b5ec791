"""What a course's instructor may reserve (hub_ext/reservations/bounds.py), without a hub:
no sooner than the warning time, so many GPUs at once, hours per occurrence and days
ahead; an edit that only gives back is always allowed."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.reservations.bounds import Bounds, OutOfBounds, ReservationBounds, check_bounds
from hub_ext.reservations.rules import Spec

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
WARNING = 900.0
ML101 = Bounds("ML101", max_gpus=None, max_hours=4, max_days_ahead=120)


def lab(gpus=1, start=NOW + timedelta(days=5), hours=2.0, id=None, **kw) -> Spec:
    return Spec(
        group="ml101", gpus=gpus, start=start, end=start + timedelta(hours=hours), id=id, **kw
    )


def refused(spec, before=None, others=(), bounds=ML101, capacity=4) -> str:
    with pytest.raises(OutOfBounds) as e:
        check_bounds(spec, before, list(others), bounds, capacity, NOW, WARNING)
    return str(e.value)


def allowed(spec, before=None, others=(), bounds=ML101, capacity=4) -> None:
    check_bounds(spec, before, list(others), bounds, capacity, NOW, WARNING)


def test_a_reservation_within_the_bounds_is_allowed():
    allowed(lab(gpus=2, hours=4, rrule="FREQ=WEEKLY;COUNT=16"))


def test_the_whole_hub_from_now_for_30_days_is_refused_it_starts_before_the_warning():
    """The attack of issue 28: both GPUs from now for 30 days."""
    text = refused(lab(gpus=2, start=NOW, hours=30 * 24), capacity=2)
    assert text == (
        "An instructor's reservation starts at least 15 min from now, so that members whose "
        "servers hold the GPUs are warned first: this one starts Thu 2026-11-26 09:00 UTC. "
        "Start it at Thu 2026-11-26 09:15 UTC or later, or ask an admin."
    )
    # the earliest start named is a whole minute the request may use
    with pytest.raises(OutOfBounds, match="Start it at Thu 2026-11-26 09:16 UTC or later"):
        check_bounds(lab(start=NOW + timedelta(minutes=15)), None, [], ML101, 4, NOW, 920)
    allowed(lab(start=NOW + timedelta(minutes=15)))


def test_one_occurrence_lasts_at_most_the_courses_hours():
    assert refused(lab(hours=4.5)) == (
        "ML101's reservations last at most 4 hours per occurrence; this one lasts 4 h 30 min. "
        "Shorten it, or ask an admin (GPUHUB_COURSES field max_reservation_hours)."
    )


def test_a_weekly_rule_of_1000_occurrences_every_3_weeks_is_refused():
    text = refused(lab(rrule="FREQ=WEEKLY;INTERVAL=3;COUNT=1000"))
    assert text.startswith(
        "ML101's reservations reach at most 120 days ahead (until Fri 2027-03-26 09:00 UTC); "
        "its last occurrence ends Tue 2084-05-09 11:00 UTC. "
    )
    assert text.endswith(
        "Give a smaller COUNT or an earlier UNTIL, or ask an admin (GPUHUB_COURSES field "
        "max_days_ahead)."
    )
    assert "it ends Fri 2027-11-26" in refused(lab(start=NOW + timedelta(days=365)))
    allowed(lab(rrule="FREQ=WEEKLY;INTERVAL=3;COUNT=5"))


def test_the_course_holds_at_most_half_the_hubs_gpus_by_default():
    assert refused(lab(gpus=3)) == (
        "ML101 may reserve at most 2 GPUs at once, half of the hub's 4; this reservation asks "
        "for 3. Ask an admin (GPUHUB_COURSES field max_reserved_gpus)."
    )
    assert "at most 1 GPU at once, half of the hub's 1;" in refused(lab(gpus=2), capacity=1)
    assert "at most 3 1g.5gb MIG slices at once;" in refused(
        lab(gpus=4, mig_profile="1g.5gb"), bounds=Bounds("ML101", max_gpus=3)
    )


def test_the_courses_reservations_count_together_at_once():
    """Two reservations of 2 GPUs that overlap are 4 at once: the second is refused, naming
    the first (the course's own)."""
    first = lab(gpus=2, id=7)
    text = refused(lab(gpus=1, start=first.start + timedelta(hours=1)), others=[first])
    assert text == (
        "ML101 may reserve at most 2 GPUs at once, half of the hub's 4; with reservation 7 "
        "(2 GPUs, Tue 2026-12-01 09:00 UTC to Tue 2026-12-01 11:00 UTC) this one would hold 3 "
        "at Tue 2026-12-01 10:00 UTC. Ask an admin (GPUHUB_COURSES field max_reserved_gpus)."
    )
    allowed(lab(gpus=1, start=first.end), others=[first])  # after it
    allowed(lab(gpus=1, start=first.start, id=7), others=[first])  # itself, edited


def test_an_edit_that_only_gives_back_is_allowed_beyond_the_bounds():
    """An admin gave ML101 3 GPUs, every week for a year, from now: the instructor may
    cancel a week, shorten it, lower it or change its note, but not add to it."""
    big = lab(gpus=3, start=NOW, hours=4, rrule="FREQ=WEEKLY;COUNT=52", id=9)
    week = NOW + timedelta(weeks=2)

    allowed(replace(big, exdates=(week,)), before=big)
    allowed(replace(big, end=big.end - timedelta(hours=1)), before=big)
    allowed(replace(big, gpus=2), before=big)
    allowed(replace(big, note="lab"), before=big)
    # more GPUs in the window open now: refused (its non-members would be stopped at once)
    assert refused(replace(big, gpus=4), before=big, capacity=8).startswith(
        "An instructor's reservation starts at least 15 min from now"
    )
    # an hour longer each week: beyond the hours
    assert "last at most 4 hours per occurrence" in refused(
        replace(big, end=big.end + timedelta(hours=1)), before=big
    )
    # one more week, at the end: beyond the days ahead
    assert "reach at most 120 days ahead" in refused(
        replace(big, rrule="FREQ=WEEKLY;COUNT=53"), before=big
    )


def test_a_course_of_no_bounds_in_the_file_has_the_defaults():
    bounds = ReservationBounds(
        courses={"ml101": {"label": "ML101", "max_reserved_gpus": 1, "max_days_ahead": 30}}
    )
    assert bounds.of("ml101") == Bounds("ML101", 1, 8.0, 30)
    assert bounds.of("ml102") == Bounds("ml102", None, 8.0, 120)
    assert bounds.of("ml101").summary(4, WARNING) == (
        "ML101 may reserve up to 1 GPU at once, 8 hours per occurrence, up to 30 days ahead, "
        "starting at least 15 min from now. An admin may reserve more."
    )
