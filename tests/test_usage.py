"""Run records and the usage report, without a hub: a real SQLite database and ledger entries.

The whole path (hub, ledger, ``gpuhub usage`` as a command) runs in
``tests/test_culling_hub.py::test_idle_gpu_server_is_culled_and_the_member_told_why``.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from hub_ext.common import runs
from hub_ext.credits.client import Transaction
from hub_ext.ops.usage import UsageRow, _print, credits_by_run, gpu_seconds, summarise

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request, hub_db):
    """The hub's database on SQLite (the embedded default), then on PostgreSQL."""
    if request.param == "sqlite":
        yield hub_db
        return
    engine = create_engine(request.getfixturevalue("postgres_url"))
    with Session(engine) as session:
        yield session
    engine.dispose()


def start(
    db,
    user="alice",
    server="",
    devices=("GPU-0",),
    hours=0.0,
    groups=("ml101",),
    credits_run=None,
    line_wait=None,
) -> int:
    return runs.open_run(
        db,
        username=user,
        server_name=server,
        profile="gpu",
        groups=list(groups),
        devices=list(devices),
        started_at=at(hours),
        credits_run=credits_run,
        line_wait=line_wait,
    )


def test_starts_from_the_line_are_counted_with_their_wait(db):
    start(db, user="alice", line_wait=600)
    start(db, user="alice", server="b", hours=1, line_wait=1200)
    start(db, user="alice", server="c", hours=2)
    start(db, user="bob", hours=-1, line_wait=60)  # began before the period
    [alice, bob] = summarise(runs.runs_overlapping(db, at(0)), None, at(0), at(24), "user")
    assert (alice.line_starts, alice.average_wait) == (2, "15.0")
    assert (bob.line_starts, bob.average_wait) == (0, "-")


def test_a_runs_table_from_before_the_line_gains_its_column(tmp_path):
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    engine = create_engine(f"sqlite:///{tmp_path / 'old.sqlite'}")
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE gpuhub_server_runs (id INTEGER PRIMARY KEY, username VARCHAR(255), "
                "server_name VARCHAR(255), profile VARCHAR(255), groups JSON, devices JSON, "
                "started_at DATETIME, stopped_at DATETIME, stop_reason VARCHAR(32), "
                "credits_run VARCHAR(64))"
            )
        )
    with Session(engine) as session:
        start(session, line_wait=30)
        [run] = runs.runs_overlapping(session, at(-1))
        assert run.line_wait_s == 30
    engine.dispose()


def test_a_retried_start_records_one_run(db):
    assert start(db) == start(db)
    assert len(runs.runs_overlapping(db, at(-1))) == 1


def test_a_run_closes_once_and_its_reason_can_be_corrected(db):
    run_id = start(db)
    runs.close_run(db, run_id, at(2), "stopped")
    runs.close_run(db, run_id, at(5), "idle_gpu")  # a second stop changes nothing
    runs.set_reason(db, run_id, "idle")
    [run] = runs.runs_overlapping(db, at(-1))
    assert (run.stopped_at, run.stop_reason) == (at(2).replace(tzinfo=None), "idle")
    with pytest.raises(ValueError, match="unknown stop reason 'bored'"):
        runs.close_run(db, run_id, at(2), "bored")


def test_runs_overlapping_a_period(db):
    early = start(db, server="early")
    runs.close_run(db, early, at(1), "stopped")
    late = start(db, server="late", hours=10)
    still = start(db, server="still", hours=3)
    runs.close_run(db, late, at(11), "stopped")
    found = runs.runs_overlapping(db, at(2), at(10))
    assert [r.id for r in found] == [still]
    assert {r.id for r in runs.runs_overlapping(db, at(0.5))} == {early, late, still}


def test_gpu_hours_count_only_inside_the_period(db):
    run_id = start(db, devices=("GPU-0", "GPU-1"))
    runs.close_run(db, run_id, at(3), "stopped")
    [run] = runs.runs_overlapping(db, at(0))
    assert gpu_seconds(run, at(1), at(10)) == 2 * 2 * 3600
    assert gpu_seconds(run, at(0), at(2)) == 2 * 2 * 3600
    running = runs.runs_overlapping(db, at(0))[0]
    running.stopped_at = None
    assert gpu_seconds(running, at(0), at(5)) == 2 * 5 * 3600


def entry(txid, kind, amount, hours, run=None, debit=None) -> Transaction:
    return Transaction(
        transaction_id=txid,
        kind=kind,
        username="alice",
        amount=Decimal(amount),
        balance=Decimal("0"),
        created_at=at(hours),
        debit_id=debit,
        metadata={"server_id": run} if run else {},
    )


def test_credits_per_run_are_debits_less_their_refunds_in_the_period():
    ledger = [
        entry("g", "grant", "10.00", 0),
        entry("d0", "debit", "1.00", 0.1, run="r1"),
        entry("d1", "debit", "1.00", 0.35, run="r1"),
        entry("f1", "refund", "0.66", 0.4, debit="d1"),
        entry("d2", "debit", "1.00", 5, run="r2"),  # after the period
        entry("d3", "debit", "1.00", -1, run="r0"),  # before it
        entry("f3", "refund", "0.50", 0.2, debit="d3"),  # refund in it of a debit before
    ]
    assert credits_by_run(ledger, at(0), at(4)) == {"r1": Decimal("1.34"), "r0": Decimal("-0.50")}


def test_report_by_user_and_by_group(db):
    a = start(db, user="alice", groups=("ml101", "vision"), credits_run="r1")
    b = start(db, user="bob", devices=(), groups=(), hours=1)
    runs.close_run(db, a, at(2), "idle_gpu")
    runs.close_run(db, b, at(2), "stopped")
    found = runs.runs_overlapping(db, at(0))
    charged = {"r1": Decimal("3.01")}
    assert summarise(found, charged, at(0), at(24), "user") == [
        UsageRow("alice", 1, 2.0, Decimal("3.01")),
        UsageRow("bob", 1, 0.0, Decimal("0.00")),
    ]
    assert summarise(found, None, at(0), at(24), "group") == [
        UsageRow("(no group)", 1, 0.0, None),
        UsageRow("ml101", 1, 2.0, None),
        UsageRow("vision", 1, 2.0, None),
    ]
    with pytest.raises(ValueError, match="--by 'room'"):
        summarise(found, None, at(0), at(24), "room")


def test_report_prints_a_table_or_csv():
    rows = [
        UsageRow("alice", 2, 1.256, Decimal("3.01"), line_starts=2, line_wait_s=1500),
        UsageRow("bob", 1, 0.0, None),
    ]
    out = io.StringIO()
    _print(rows, "user", True, out)
    assert out.getvalue() == (
        "user,servers,gpu_hours,credits,line_starts,average_wait_min\n"
        "alice,2,1.26,3.01,2,12.5\nbob,1,0.00,-,0,-\n"
    )
    out = io.StringIO()
    _print(rows, "user", False, out)
    assert out.getvalue().splitlines() == [
        "USER   SERVERS  GPU-HOURS    CREDITS  LINE STARTS  AVG WAIT MIN",
        "alice        2       1.26       3.01            2          12.5",
        "bob          1       0.00          -            0             -",
    ]


def test_notebook_jobs_are_counted_apart_from_servers_with_their_gpu_hours(hub_db):
    server = start(hub_db, user="alice", server="", hours=0)
    job = start(hub_db, user="alice", server="job-0123456789ab", devices=("GPU-1",), hours=1)
    runs.close_run(hub_db, server, at(2), "stopped")
    runs.close_run(hub_db, job, at(1.5), "job_ended")
    [alice] = summarise(runs.runs_overlapping(hub_db, at(0)), None, at(0), at(24), "user")
    assert (alice.servers, alice.jobs, alice.gpu_hours, alice.job_gpu_hours) == (1, 1, 2.5, 0.5)
    out = io.StringIO()
    _print([alice], "user", True, out, jobs=True)
    assert out.getvalue() == (
        "user,servers,gpu_hours,credits,line_starts,average_wait_min,jobs,job_gpu_hours\n"
        "alice,1,2.50,-,0,-,1,0.50\n"
    )
    out = io.StringIO()
    _print([alice], "user", False, out, jobs=True)
    assert out.getvalue().splitlines()[0].endswith("AVG WAIT MIN   JOBS  JOB GPU-HOURS")
    assert out.getvalue().splitlines()[1].endswith("-      1           0.50")


def test_gpu_kernels_are_counted_apart_from_servers_and_jobs(hub_db):
    server = start(hub_db, user="alice", server="", hours=0)
    job = start(hub_db, user="alice", server="job-0123456789ab", devices=("GPU-1",), hours=1)
    kernel = start(hub_db, user="alice", server="kernel-0a1b2c3d4e5f", devices=("GPU-2",), hours=2)
    runs.close_run(hub_db, server, at(4), "stopped")
    runs.close_run(hub_db, job, at(1.5), "job_ended")
    runs.close_run(hub_db, kernel, at(2.25), "idle")
    [alice] = summarise(runs.runs_overlapping(hub_db, at(0)), None, at(0), at(24), "user")
    assert (alice.servers, alice.jobs, alice.kernels) == (1, 1, 1)
    assert (alice.gpu_hours, alice.job_gpu_hours, alice.kernel_gpu_hours) == (4.75, 0.5, 0.25)
    out = io.StringIO()
    _print([alice], "user", True, out, jobs=True, kernels=True)
    assert out.getvalue().splitlines() == [
        "user,servers,gpu_hours,credits,line_starts,average_wait_min,jobs,job_gpu_hours,"
        "kernels,kernel_gpu_hours",
        "alice,1,4.75,-,0,-,1,0.50,1,0.25",
    ]
    out = io.StringIO()
    _print([alice], "user", False, out, kernels=True)
    assert out.getvalue().splitlines()[0].endswith("AVG WAIT MIN  KERNELS  KERNEL GPU-HOURS")
    assert out.getvalue().splitlines()[1].endswith("-        1              0.25")
