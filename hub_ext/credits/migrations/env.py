"""Alembic environment of the credits ledger.

Runs on the engine handed over in ``config.attributes["engine"]`` (what the service does)
or on a URL from ``-x db_url=...`` / ``sqlalchemy.url``.  It does not configure logging,
so it never replaces the service's log handlers.
"""

from __future__ import annotations

from alembic import context

from hub_ext.credits.db import make_engine
from hub_ext.credits.models import Base

config = context.config
target_metadata = Base.metadata


def _engine():
    engine = config.attributes.get("engine")
    if engine is not None:
        return engine, False
    url = context.get_x_argument(as_dictionary=True).get("db_url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("No database: pass -x db_url=sqlite:///credits.sqlite")
    return make_engine(url), True


def run_migrations_offline() -> None:
    url = context.get_x_argument(as_dictionary=True).get("db_url") or config.get_main_option(
        "sqlalchemy.url"
    )
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine, owned = _engine()
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=target_metadata)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        if owned:
            engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
