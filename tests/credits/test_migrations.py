"""The ledger's schema comes from Alembic, and the migrations match the models."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from hub_ext.credits.db import alembic_config, make_engine, upgrade
from hub_ext.credits.models import Base
from tests.fixtures.credits import REPO_ROOT


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def empty_db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'credits.sqlite'}"
    return request.getfixturevalue("postgres_url")


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_upgrade_only_migrates_and_exits(empty_db_url):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hub_ext.credits.service",
            "--upgrade-only",
            "--db-url",
            empty_db_url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    engine = sa.create_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert (
                conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == head_revision()
            )
            tables = set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert {"accounts", "transactions", "alembic_version"} <= tables


def test_migrations_match_the_models(empty_db_url):
    engine = make_engine(empty_db_url)
    try:
        upgrade(engine)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_downgrade_to_base_and_up_again(empty_db_url):
    engine = make_engine(empty_db_url)
    try:
        upgrade(engine)
        command.downgrade(alembic_config(engine), "base")
        with engine.connect() as conn:
            assert "transactions" not in sa.inspect(conn).get_table_names()
        upgrade(engine)
        with engine.connect() as conn:
            assert "transactions" in sa.inspect(conn).get_table_names()
    finally:
        engine.dispose()


def test_service_refuses_to_start_without_a_hub_token(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hub_ext.credits.service",
            "--port",
            "0",
            "--db-url",
            f"sqlite:///{tmp_path / 'c.sqlite'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 2
    assert "GPUHUB_CREDITS_HUB_TOKEN" in done.stderr
