"""The credits hook's unsettled settlements in the hub database, on SQLite and PostgreSQL.

The whole path (a stop while the Credits API is down, the hub killed, the refund after
its restart) is ``tests/test_credits_hub.py::
test_refund_owed_while_the_api_was_down_survives_a_hub_restart``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session

from hub_ext.credits.metering import MeterRecord
from hub_ext.credits.unsettled import Owed, UnsettledRow, UnsettledStore

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
LOG = logging.getLogger("test_unsettled")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request, hub_db):
    """A store on the hub's database: SQLite (the embedded default), then PostgreSQL."""
    store = UnsettledStore(LOG)
    if request.param == "sqlite":
        store.attach(hub_db)
        yield store
        return
    engine = create_engine(request.getfixturevalue("postgres_url"))
    with Session(engine) as session:
        store.attach(session)
        yield store
    engine.dispose()


def record(user="alice", server="", started=T0) -> MeterRecord:
    one = MeterRecord.new(user, server, "gpu", started, Decimal("4"), 900)
    one.debits[0] = "txn-0"
    return one


def test_a_stop_owed_reads_back_as_it_was_written(store):
    stopped = T0 + timedelta(seconds=300)
    store.keep(Owed("stop", record(), stopped, charge_to_stop=True))
    [owed] = store.load()
    assert (owed.kind, owed.stopped_at, owed.charge_to_stop) == ("stop", stopped, True)
    assert owed.record == record()  # debits included: the refund names its debit


def test_one_row_per_server_run_and_gone_once_settled(store):
    first, other = record(), record(server="b")
    store.keep(Owed("stop", first, T0, charge_to_stop=True))
    store.keep(Owed("stop", first, T0, charge_to_stop=False))  # written again: replaced
    store.keep(Owed("void", other, why="was refused"))
    assert sorted((o.record.server_name, o.kind, o.charge_to_stop) for o in store.load()) == [
        ("", "stop", False),
        ("b", "void", True),
    ]
    store.drop(first.server_id)
    store.drop(first.server_id)  # idempotent
    assert [o.record.server_name for o in store.load()] == ["b"]


def test_an_unreadable_row_is_logged_and_the_others_still_load(store, caplog):
    store.keep(Owed("stop", record(), T0))
    store.keep(Owed("stop", record(user="bob"), T0))
    store.db.execute(
        update(UnsettledRow).where(UnsettledRow.username == "bob").values(record={"version": 99})
    )
    store.db.commit()
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        assert [o.record.username for o in store.load()] == ["alice"]
    assert "Cannot read the unsettled credits row" in caplog.text


def test_without_a_database_nothing_is_written_and_nothing_raised():
    store = UnsettledStore(LOG)
    store.keep(Owed("stop", record(), T0))
    store.drop(record().server_id)
    assert store.load() == []
