"""What a server owes, without a hub: interval amounts, interval numbers, keys, refunds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from hub_ext.credits.metering import (
    MeterRecord,
    as_decimal,
    debit_key,
    interval_amount,
    interval_index,
    refund_amount,
    refund_key,
    server_id,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("per_hour", "interval", "amount"),
    [
        pytest.param("2", 900, "0.50", id="2-per-hour-15-min"),
        pytest.param("1", 900, "0.25", id="1-per-hour-15-min"),
        pytest.param("4", 3600, "4.00", id="hourly"),
        pytest.param("1", 600, "0.17", id="a-sixth-rounds-half-up"),
        pytest.param("0.1", 900, "0.03", id="0.025-rounds-half-up"),
        pytest.param("0.01", 900, "0.01", id="never-free-by-rounding"),
        pytest.param("0", 900, "0.00", id="free"),
        pytest.param("7.5", 2, "0.01", id="two-second-test-interval"),
    ],
)
def test_interval_amount_is_price_times_interval_in_cents(per_hour, interval, amount):
    assert interval_amount(Decimal(per_hour), interval) == Decimal(amount)
    assert str(interval_amount(Decimal(per_hour), interval)) == amount


def test_interval_amount_refuses_negative_price_and_empty_interval():
    with pytest.raises(ValueError, match="negative"):
        interval_amount(Decimal("-1"), 900)
    with pytest.raises(ValueError, match="interval"):
        interval_amount(Decimal("1"), 0)


def test_float_prices_become_their_shortest_decimal():
    assert as_decimal(2.1) == Decimal("2.1")
    assert as_decimal(3) == Decimal(3)
    with pytest.raises(ValueError):
        as_decimal(float("nan"))


@pytest.mark.parametrize(
    ("elapsed", "index"),
    [(-5, 0), (0, 0), (899.9, 0), (900, 1), (1799, 1), (2700, 3)],
)
def test_interval_index_counts_whole_intervals_from_the_start(elapsed, index):
    assert interval_index(T0, at(elapsed), 900) == index


@pytest.mark.parametrize(
    ("stopped", "index", "refund"),
    [
        pytest.param(0, 0, "1.00", id="stopped-at-once-refunds-all"),
        pytest.param(225, 0, "0.75", id="a-quarter-used"),
        pytest.param(300, 0, "0.66", id="a-third-used-rounds-down"),
        pytest.param(900, 0, "0.00", id="all-used"),
        pytest.param(2025, 2, "0.75", id="third-interval"),
        pytest.param(100, 2, "1.00", id="interval-not-begun"),
    ],
)
def test_refund_is_the_unused_part_rounded_down(stopped, index, refund):
    assert refund_amount(Decimal("1.00"), T0, 900, index, at(stopped)) == Decimal(refund)


def test_keys_are_stable_per_server_run_and_interval():
    sid = server_id("alice", "", T0)
    assert sid == server_id("alice", "", T0)
    assert sid != server_id("alice", "", at(1))
    assert sid != server_id("alice", "gpu", T0)
    assert sid != server_id("bob", "", T0)
    assert debit_key(sid, 0) != debit_key(sid, 1)
    assert debit_key(sid, 1) != refund_key(sid, 1)
    # the contract: 8 to 255 characters, whatever the username
    long = server_id("x" * 255, "y" * 255, T0)
    assert 8 <= len(debit_key(long, 10**6)) <= 255
    assert 8 <= len(refund_key(long, 10**6)) <= 255


def test_server_names_cannot_be_confused_by_concatenation():
    assert server_id("ab", "c", T0) != server_id("a", "bc", T0)


def test_record_round_trips_through_spawner_state():
    record = MeterRecord.new("alice", "gpu", "pytorch", T0, Decimal("2"), 900)
    record.debits = {0: "tx-0", 1: "tx-1"}
    record.refunds = {1: Decimal("0.25")}
    record.refused_at = at(950)
    record.refused_balance = Decimal("0.10")
    state = record.to_state()
    import json

    again = MeterRecord.from_state(json.loads(json.dumps(state)))
    assert again == record
    assert again.server_id == record.server_id
    assert record.to_state() is not state  # a fresh dict each time


def test_replayed_requests_are_byte_for_byte_the_same():
    one = MeterRecord.new("alice", "", "pytorch", T0, Decimal("2"), 900)
    two = MeterRecord.from_state(one.to_state())
    for index in (0, 1, 7):
        assert one.reason(index) == two.reason(index)
        assert one.metadata(index) == two.metadata(index)
    assert one.metadata(3)["interval"] == "3"
    assert "15 min" in one.reason(0)


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(None, id="none"),
        pytest.param({"version": 99}, id="other-version"),
        pytest.param({"version": 1, "username": "a"}, id="missing-fields"),
        pytest.param(
            {
                "version": 1,
                "username": "a",
                "server_name": "",
                "started_at": "yesterday",
                "credits_per_hour": "1",
                "interval": 900,
                "amount": "0.25",
            },
            id="bad-time",
        ),
    ],
)
def test_malformed_state_is_refused(state):
    with pytest.raises(ValueError):
        MeterRecord.from_state(state)
