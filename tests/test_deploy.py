"""``gpuhub init`` and ``gpuhub upgrade`` (hub_ext/ops/deploy.py): a private .env with fresh
secrets that is never overwritten by accident, and migrations of both databases on real
SQLite files and a real PostgreSQL."""

from __future__ import annotations

import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from jupyterhub import dbutil, orm

from hub_ext.credits.db import head_revision
from hub_ext.ops.deploy import SECRETS, upgrade, write_env
from tests.fixtures.credits import REPO_ROOT
from tests.test_config import settings_from

LOG = logging.getLogger("test.upgrade")


def read_env(env: Path | str) -> dict[str, str]:
    """The KEY=value lines of a .env file (or of its text)."""
    text = env.read_text() if isinstance(env, Path) else env
    return dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )


def gpuhub(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


# -- init -------------------------------------------------------------------------------------


def test_init_writes_a_private_env_with_fresh_secrets(tmp_path):
    socket = tmp_path / "docker.sock"
    socket.touch()
    if os.geteuid() == 0:
        os.chown(socket, -1, 4242)
    old = os.umask(0)  # even an admin's careless umask gives a private file
    try:
        first = write_env(tmp_path / ".env", socket=str(socket))
    finally:
        os.umask(old)
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    values = read_env(first)
    for name in SECRETS:
        assert re.fullmatch(r"[0-9a-f]{64}", values[name]), name
    assert len({values[name] for name in SECRETS}) == len(SECRETS)  # no secret used twice
    assert values["GPUHUB_DOCKER_GID"] == str(socket.stat().st_gid)
    assert values["COMPOSE_PROFILES"] == "credits"
    assert values["GPUHUB_OIDC_ISSUER"] == ""  # the site fills it in; the hub refuses without

    second = read_env(write_env(tmp_path / "other.env", socket=str(socket)))
    assert all(second[name] != values[name] for name in SECRETS)


def test_init_never_overwrites_without_force(tmp_path):
    r = gpuhub("init", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    env = tmp_path / ".env"
    before = env.read_text()
    r = gpuhub("init", cwd=tmp_path)
    assert r.returncode == 1
    assert ".env exists" in r.stderr and "--force" in r.stderr
    assert env.read_text() == before

    env.chmod(0o644)
    r = gpuhub("init", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert read_env(env)["JUPYTERHUB_CRYPT_KEY"] != read_env(before)["JUPYTERHUB_CRYPT_KEY"]
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [".env"]  # no half-written leftovers


def test_init_without_a_docker_socket_says_how_to_find_the_group(tmp_path):
    r = gpuhub("init", "--docker-socket", str(tmp_path / "none.sock"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / ".env").read_text()
    assert "GPUHUB_DOCKER_GID=\n" in text
    assert f"stat -c %g {tmp_path / 'none.sock'}" in text


def test_init_needs_no_virtualenv(tmp_path):
    """Before `scripts/setup.sh`, the system's python3 can write .env (stdlib only)."""
    r = subprocess.run(
        ["/usr/bin/python3", "-m", "hub_ext.cli", "init"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
    )
    assert r.returncode == 0, r.stderr
    assert set(SECRETS) <= set(read_env(tmp_path / ".env"))


# -- upgrade ----------------------------------------------------------------------------------


def test_upgrade_of_the_embedded_sqlite_files(tmp_path, monkeypatch):
    steps = upgrade(settings_from(tmp_path, monkeypatch), LOG)
    hub, credits = steps
    assert hub.url == f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    assert hub.outcome.startswith("new: stamped revision ")
    assert credits.url == f"sqlite:///{tmp_path / 'credits.sqlite'}"
    assert credits.outcome == f"migrated from an empty database to {head_revision()}"
    again = upgrade(settings_from(tmp_path, monkeypatch), LOG)
    assert [s.outcome.split(" (")[0] for s in again] == ["up to date", "up to date"]


def test_upgrade_skips_the_ledger_of_a_site_credits_api(tmp_path, monkeypatch):
    settings = settings_from(
        tmp_path,
        monkeypatch,
        GPUHUB_CREDITS_URL="https://credits.example.org",
        GPUHUB_CREDITS_TOKEN="t",
    )
    _, credits = upgrade(settings, LOG)
    assert credits.outcome == "skipped: GPUHUB_CREDITS_URL is the site's own Credits API"
    assert not (tmp_path / "credits.sqlite").exists()


def make_hub_schema_one_revision_old(url: str) -> None:
    """A hub database made by the current JupyterHub, then migrated one revision down."""
    orm.new_session_factory(url).kw["bind"].dispose()
    with dbutil._temp_alembic_ini(url) as ini:
        command.downgrade(Config(ini), "-1")


@pytest.mark.postgres
def test_upgrade_migrates_an_older_hub_database_and_a_new_ledger(
    tmp_path, monkeypatch, postgres_server
):
    hub_url = postgres_server.create_database("hub")
    credits_url = postgres_server.create_database("ledger")
    make_hub_schema_one_revision_old(hub_url)
    # passwords come separately, so that the URLs can be shown (this server trusts loopback)
    settings = settings_from(
        tmp_path,
        monkeypatch,
        GPUHUB_DB_URL=hub_url,
        GPUHUB_DB_PASSWORD="hub-secret",
        GPUHUB_CREDITS_DB_URL=credits_url,
        GPUHUB_CREDITS_DB_PASSWORD="ledger-secret",
    )
    hub, credits = upgrade(settings, LOG)
    assert re.fullmatch(r"migrated from \w+ to \w+", hub.outcome), hub.outcome
    assert hub.url == hub_url.replace("postgres@", "postgres:***@")
    assert credits.outcome == f"migrated from an empty database to {head_revision()}"
    assert "secret" not in hub.url + credits.url
    again, _ = upgrade(settings, LOG)
    assert again.outcome.startswith("up to date")


def test_upgrade_failure_is_one_line_without_the_password(tmp_path):
    env = {
        "GPUHUB_STATE_DIR": str(tmp_path),
        "GPUHUB_DB_PASSWORD": "do-not-show-me",
        "GPUHUB_DB_URL": "postgresql+psycopg://hub@127.0.0.1:1/jupyterhub",
    }
    r = gpuhub("upgrade", cwd=tmp_path, env=env)
    assert r.returncode == 1
    assert "gpuhub upgrade: failed: OperationalError" in r.stderr
    assert "do-not-show-me" not in r.stdout + r.stderr
