"""The course budget's rules alone: which intervals a course pays, what the ledger reads,
which member's server counts inside a window (the hub test is test_course_budget_hub.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

from hub_ext.credits.metering import MeterRecord
from hub_ext.reservations.budget import course_payer
from hub_ext.reservations.policy import Holding, Window

T0 = datetime(2026, 11, 26, 14, 0, tzinfo=UTC)


def paid_by_course(until: datetime) -> MeterRecord:
    record = MeterRecord.new("alice", "", "gpu", T0, Decimal(4), 900)
    record.course, record.course_account, record.paid_until = "ml101", "course-ml101", until
    return record


def test_intervals_beginning_after_the_window_are_the_members():
    record = paid_by_course(T0 + timedelta(minutes=20))  # the window ends in interval 1
    assert [record.account(i) for i in range(3)] == ["course-ml101", "course-ml101", "alice"]
    assert record.metadata(0)["member"] == "alice" and record.metadata(0)["course"] == "ml101"
    assert "course" not in record.metadata(2)
    assert record.reason(0).startswith("Course ml101: Server alice (gpu)")


def test_the_payer_survives_a_restart():
    record = paid_by_course(T0 + timedelta(hours=2))
    again = MeterRecord.from_state(record.to_state())
    assert again.account(0) == "course-ml101" and again.paid_until == record.paid_until


def test_a_record_written_before_the_course_budget_is_the_members():
    state = MeterRecord.new("alice", "", "gpu", T0, Decimal(4), 900).to_state()
    for key in ("course", "course_account", "paid_until"):
        del state[key]
    assert MeterRecord.from_state(state).account(0) == "alice"


def test_the_course_pays_for_the_servers_inside_its_reservation_only():
    window = Window(1, "ml101", "ML101", "gpu", 1, T0, T0 + timedelta(hours=2))
    holdings = [
        Holding(("bob", ""), "bob", "gpu", 1, 200.0, frozenset({"ml101"})),
        Holding(("alice", ""), "alice", "gpu", 1, 100.0, frozenset({"ml101"})),
        Holding(("eve", ""), "eve", "gpu", 1, 50.0, frozenset()),
    ]
    rules = SimpleNamespace(open=[window], _holdings=lambda: holdings)
    courses = {"ml101": {"group": "ml101", "account": "course-ml101", "display_name": "ML101"}}
    payer = course_payer(rules, ("alice", ""), courses)  # the first of the group
    assert (payer.slug, payer.account, payer.until) == ("ml101", "course-ml101", window.end)
    assert payer.until_text() == "16:00 UTC"  # T0's day: no date
    week = Window(1, "ml101", "ML101", "gpu", 1, T0, T0 + timedelta(days=7))
    later = course_payer(
        SimpleNamespace(open=[week], _holdings=lambda: holdings), ("alice", ""), courses
    )
    assert later.until_text() == "Thu 2026-12-03 14:00 UTC"  # another day: dated
    assert course_payer(rules, ("bob", ""), courses) is None  # beyond the reserved GPU
    assert course_payer(rules, ("eve", ""), courses) is None  # not in the group
    no_account = {"ml101": {"group": "ml101", "account": None}}
    assert course_payer(rules, ("alice", ""), no_account) is None
