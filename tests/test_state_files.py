"""The state directory is the hub's alone: mode 0700, its SQLite databases (the hub's and
the credits ledger, with their -wal/-shm files) mode 0600 (hub_ext/common/private_files.py)."""

from __future__ import annotations

import stat

import pytest

from hub_ext.common.private_files import private_dir, private_sqlite
from hub_ext.credits.db import make_engine, upgrade
from tests.fixtures.hub import eventually
from tests.test_config import configure


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_state_dir_and_hub_database_are_private(tmp_path, monkeypatch):
    state = tmp_path / "var"
    configure(state, monkeypatch)
    assert mode(state) == 0o700
    assert mode(state / "jupyterhub.sqlite") == 0o600


def test_an_existing_state_dir_and_database_are_narrowed(tmp_path, monkeypatch):
    state = tmp_path / "var"
    state.mkdir(mode=0o755)
    (state / "jupyterhub.sqlite").touch(mode=0o644)
    state.chmod(0o755)
    (state / "jupyterhub.sqlite").chmod(0o644)
    configure(state, monkeypatch)
    assert (mode(state), mode(state / "jupyterhub.sqlite")) == (0o700, 0o600)


def test_wal_and_shm_files_left_behind_are_narrowed(tmp_path, monkeypatch):
    # a hub killed with SIGKILL leaves its -wal and -shm files; SQLite reuses them as found
    state = tmp_path / "var"
    state.mkdir(mode=0o700)
    for name in ("jupyterhub.sqlite", "jupyterhub.sqlite-wal", "jupyterhub.sqlite-shm"):
        (state / name).touch()
        (state / name).chmod(0o644)
    configure(state, monkeypatch)
    assert {f.name: mode(f) for f in state.iterdir() if f.name.startswith("jupyterhub.")} == {
        "jupyterhub.sqlite": 0o600,
        "jupyterhub.sqlite-wal": 0o600,
        "jupyterhub.sqlite-shm": 0o600,
    }


def test_postgres_and_in_memory_urls_are_left_alone(tmp_path):
    private_sqlite("postgresql+psycopg://hub@db/hub")
    private_sqlite("sqlite://")
    private_sqlite("sqlite:///:memory:")
    assert private_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert mode(tmp_path / "a" / "b") == 0o700


def test_the_ledger_and_its_wal_files_are_private(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger' / 'credits.sqlite'}", pool_size=1)
    try:
        upgrade(engine)
        with engine.connect() as conn:  # WAL mode: -wal and -shm exist while connected
            files = sorted((tmp_path / "ledger").iterdir())
            assert {f.name for f in files} >= {"credits.sqlite", "credits.sqlite-wal"}
            assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
            conn.exec_driver_sql("SELECT 1")
    finally:
        engine.dispose()
    assert mode(tmp_path / "ledger") == 0o700


@pytest.mark.docker
@pytest.mark.hub
async def test_a_running_hub_keeps_its_databases_private(hub_factory):
    hub = await hub_factory()
    ledger = hub.state_dir / "credits.sqlite"
    await eventually(lambda: _exists(ledger), what="the credits service's ledger")
    assert mode(hub.state_dir) == 0o700
    db_files = [p for p in hub.state_dir.iterdir() if ".sqlite" in p.name]
    assert {p.name for p in db_files} >= {"jupyterhub.sqlite", "credits.sqlite"}
    assert {p.name: mode(p) for p in db_files} == {p.name: 0o600 for p in db_files}


async def _exists(path) -> bool:
    return path.exists() and path.stat().st_size > 0
