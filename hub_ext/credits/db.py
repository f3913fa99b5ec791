"""Database engines and migrations of the reference credits service.

SQLite (``sqlite:///path/credits.sqlite``) is the embedded default; PostgreSQL
(``postgresql+psycopg://user@host/db``) is the production path.  The two differ in how a
debit is made atomic, and this module sets each up:

- SQLite has no row locks, so every write transaction starts with ``BEGIN IMMEDIATE``,
  which takes the database's write lock up front: two debits, in any threads or
  processes, run one after the other (SQLite docs, "BEGIN TRANSACTION").  Reads use a
  plain deferred ``BEGIN`` and, in WAL mode, never wait for writers.
- PostgreSQL locks the account row with ``SELECT ... FOR UPDATE`` inside the write (see
  :mod:`hub_ext.credits.ledger`); the engine needs nothing special.

The schema comes only from the Alembic migrations in ``hub_ext/credits/migrations``;
:func:`upgrade` runs them to ``head`` (the service does at start-up).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from ..common.private_files import private_dir, private_sqlite

__all__ = ["READ_ONLY", "alembic_config", "head_revision", "make_engine", "upgrade"]

HERE = Path(__file__).resolve().parent

#: Execution option marking a connection used only for reads (plain BEGIN on SQLite).
READ_ONLY = "credits_read_only"


def make_engine(db_url: str, *, pool_size: int = 8) -> Engine:
    """An engine for ``db_url`` set up for the ledger's locking (see the module docstring).

    A SQLite file is created mode 0600 (:mod:`hub_ext.common.private_files`).  Raises
    :class:`ValueError` for an in-memory SQLite URL: the service's worker threads
    would each see a different, empty database.
    """
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        if url.database in (None, "", ":memory:"):
            raise ValueError("the credits service needs a SQLite file, not an in-memory database")
        if not Path(url.database).parent.exists():
            private_dir(Path(url.database).parent)
        private_sqlite(db_url)  # mode 0600, and so its -wal and -shm files
        engine = create_engine(
            url,
            connect_args={"timeout": 30, "check_same_thread": False},
            pool_size=pool_size,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection, connection_record) -> None:
            # Let SQLAlchemy's "begin" event below emit BEGIN instead of pysqlite.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection) -> None:
            if connection.get_execution_options().get(READ_ONLY):
                connection.exec_driver_sql("BEGIN")
            else:
                connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=4, pool_pre_ping=True)


def alembic_config(engine: Engine | None = None) -> Config:
    """The Alembic configuration of the ledger, independent of the working directory.

    With ``engine``, migrations run on it (``config.attributes["engine"]``); without, the
    ``sqlalchemy.url`` of ``alembic.ini`` or ``-x db_url=...`` is used.
    """
    config = Config(str(HERE / "alembic.ini"))
    config.set_main_option("script_location", str(HERE / "migrations"))
    if engine is not None:
        config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision`` (default: the newest)."""
    command.upgrade(alembic_config(engine), revision)


def head_revision() -> str:
    """The newest revision of the ledger's migrations (e.g. ``"0002_reason_json"``)."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
