"""The reservations' table (hub_ext/reservations/store.py) on SQLite and PostgreSQL: a rule
comes back as it went in, and a deleted reservation's id never names a new one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from hub_ext.reservations import store
from hub_ext.reservations.rules import Spec

START = datetime(2026, 12, 1, 13, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


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


def test_a_reservation_comes_back_as_it_was_stored_and_ids_are_never_reused(db):
    lab = Spec(
        group="ml101",
        gpus=2,
        start=START,
        end=START + timedelta(hours=2),
        timezone="Europe/Berlin",
        rrule="FREQ=WEEKLY;COUNT=4",
        exdates=(START + timedelta(weeks=2),),
        note="ML101 lab",
    )
    row = store.insert(db, lab, "boss", NOW)
    assert store.to_spec(store.get(db, row.id)) == Spec(**{**lab.__dict__, "id": row.id})
    assert store.to_model(row)["start"] == "2026-12-01T13:00:00+00:00"
    assert store.to_model(row)["exdates"] == ["2026-12-15T13:00:00+00:00"]
    other = store.insert(
        db, Spec(group="ml102", gpus=1, start=START, end=START + timedelta(hours=1)), "boss", NOW
    )
    assert [r.id for r in store.load(db, {"ml102"})] == [other.id]

    store.delete(db, other)
    again = store.insert(
        db, Spec(group="ml102", gpus=1, start=START, end=START + timedelta(hours=1)), "boss", NOW
    )
    assert again.id > other.id
    assert [s.group for s in store.all_specs(db)] == ["ml101", "ml102"]
