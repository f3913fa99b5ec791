"""``gpuhub init`` and ``gpuhub upgrade``: the two operator steps of a deployment.

- :func:`write_env` makes the ``.env`` that ``docker-compose.yml`` reads: fresh secrets
  (cookie secret, crypt key, Credits API tokens, database passwords), the Docker socket's
  group, and the settings a site fills in (login, TLS).  It is created mode 0600 and never
  replaced unless asked (``--force``): its secrets are already in use once a deployment ran
  (the crypt key encrypts ``auth_state``, the database roles were made with the passwords).
- :func:`upgrade` migrates both databases to the schema of the installed code: the hub's
  with the function ``jupyterhub upgrade-db`` runs (``jupyterhub.dbutil.upgrade_if_needed``;
  SQLite files are backed up first), and the reference credits service's ledger with its
  Alembic migrations.  Run it after installing a new version, before starting the hub.

Both need only the standard library and the project's own dependencies; ``write_env`` needs
nothing else at all, so ``python3 -m hub_ext.cli init`` works before a virtualenv exists.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..common.dburl import hub_db_url, with_password
from ..settings import Settings

DOCKER_SOCKET = "/var/run/docker.sock"

#: The secrets of a deployment: variable -> what it is.  Each is 32 random bytes, as hex.
SECRETS = {
    "JUPYTERHUB_CRYPT_KEY": "encrypts auth_state (groups, credit balance) in the hub database",
    "JPY_COOKIE_SECRET": "signs the hub's login cookies",
    "GPUHUB_CREDITS_TOKEN": "the hub's token at the credits service (read, debit, refund)",
    "GPUHUB_CREDITS_ADMIN_TOKEN": "the credits service's admin token (grants)",
    "GPUHUB_POSTGRES_PASSWORD": "PostgreSQL superuser 'postgres' (backups, restores)",
    "GPUHUB_DB_PASSWORD": "PostgreSQL role 'hub' (database jupyterhub)",
    "GPUHUB_CREDITS_DB_PASSWORD": "PostgreSQL role 'credits' (database credits)",
}

ENV_TEMPLATE = """\
# GPU Cluster Hub: settings and secrets of this deployment, read by docker-compose.yml.
# Written by `gpuhub init` on {date}.
# Keep it private: mode 600, never committed (the hub refuses to start while others may
# read it). Any setting of docs/reference/settings.md may be added; docs/reference/compose.md
# explains each line below.

COMPOSE_PROJECT_NAME=gpuhub
# Services that `docker-compose up` starts besides the hub and PostgreSQL: remove
# "credits" when GPUHUB_CREDITS_URL points at the organisation's own Credits API.
COMPOSE_PROFILES=credits

# --- Login: the organisation's OpenID Connect provider (docs/howto/identity-provider.md) --
GPUHUB_OIDC_ISSUER=
GPUHUB_OIDC_CLIENT_ID=
GPUHUB_OIDC_CLIENT_SECRET=
GPUHUB_ALLOWED_GROUPS=
GPUHUB_ADMIN_GROUPS=
GPUHUB_ADMIN_CONTACT=
# GPUHUB_INITIAL_CREDITS=10

# --- HTTPS: put cert.pem (full chain) and key.pem in ./tls, the key owned by uid 990 -------
GPUHUB_SSL_CERT=/etc/gpuhub/tls/cert.pem
GPUHUB_SSL_KEY=/etc/gpuhub/tls/key.pem
# the host address:port that serves the hub
GPUHUB_PUBLISH=443
# Behind the site's TLS reverse proxy instead: empty the two GPUHUB_SSL_* lines, then
# GPUHUB_ALLOW_HTTP=1
# GPUHUB_PUBLISH=127.0.0.1:8000

# --- Docker: the socket's group, which the hub's user joins to start servers --------------
{docker_gid_line}

# --- Secrets: fresh and random; docs/howto/upgrades-backups.md says how to change one -----
{secrets}
"""


class EnvFileExists(Exception):
    """``.env`` is there already and ``--force`` was not given."""


def docker_gid(socket: str = DOCKER_SOCKET) -> int | None:
    """The group owning the Docker socket, or None when there is no socket."""
    try:
        return os.stat(socket).st_gid
    except FileNotFoundError:
        return None


def render_env(gid: int | None, socket: str = DOCKER_SOCKET) -> str:
    """The text of a new ``.env``, with fresh secrets (:func:`secrets.token_hex`, 32 bytes)."""
    if gid is None:
        gid_line = (
            f"# {socket} was not found: set this to `stat -c %g {socket}` on the "
            "Docker host\nGPUHUB_DOCKER_GID="
        )
    else:
        gid_line = f"GPUHUB_DOCKER_GID={gid}"
    lines = []
    for name, what in SECRETS.items():
        lines += [f"# {what}", f"{name}={secrets.token_hex(32)}"]
    return ENV_TEMPLATE.format(
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        docker_gid_line=gid_line,
        secrets="\n".join(lines),
    )


def write_env(path: Path, *, force: bool = False, socket: str = DOCKER_SOCKET) -> Path:
    """Write a new ``.env`` at ``path``, mode 0600, whatever the umask.

    Raises :class:`EnvFileExists` when ``path`` exists and ``force`` is false; with
    ``force`` the old file is replaced atomically (never left half-written).
    """
    path = Path(path)
    text = render_env(docker_gid(socket), socket)
    target = path.with_name(path.name + ".new") if force else path
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if force:  # a leftover of an interrupted run: ours to replace
            target.unlink()
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        else:
            raise EnvFileExists(path) from None
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    if force:
        os.replace(target, path)
    return path


# -- upgrade -------------------------------------------------------------------------------


@dataclass
class Step:
    """One database of :func:`upgrade`: what it is, where (password hidden), what happened."""

    name: str
    url: str
    outcome: str


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _revision(url: str, table: str = "alembic_version") -> str | None:
    """The Alembic revision stored in the database at ``url``, or None (no table yet)."""
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(url)
    try:
        if table not in inspect(engine).get_table_names():
            return None
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT version_num FROM {table}")).scalar()
    finally:
        engine.dispose()


def upgrade_hub_db(url: str, log: logging.Logger) -> str:
    """Migrate the hub database at ``url``, as ``jupyterhub upgrade-db`` does.

    An empty database is only stamped with the current revision (the hub creates its
    tables at first start).  Returns what happened, as a phrase.
    """
    from jupyterhub import dbutil

    # dbutil runs the `alembic` script of the hub's environment
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    before = _revision(url)
    dbutil.upgrade_if_needed(url, log=log)
    after = _revision(url)
    if before is None:
        return f"new: stamped revision {after} (the hub makes its tables at first start)"
    if before == after:
        return f"up to date (revision {after})"
    return f"migrated from {before} to {after}"


def upgrade_credits_db(url: str) -> str:
    """Migrate the reference credits service's ledger at ``url`` to the newest revision."""
    from ..credits.db import make_engine
    from ..credits.db import upgrade as alembic_upgrade

    before = _revision(url)
    engine = make_engine(url, pool_size=1)
    try:
        alembic_upgrade(engine)
    finally:
        engine.dispose()
    after = _revision(url)
    if before == after:
        return f"up to date (revision {after})"
    return f"migrated from {before or 'an empty database'} to {after}"


def credits_db_url(settings: Settings) -> str | None:
    """The reference service's ledger this hub uses, or None (credits off, or a site API).

    ``GPUHUB_CREDITS_DB_URL`` when set; else, when the hub runs the service itself (no
    ``GPUHUB_CREDITS_URL``), its SQLite file in the state directory.
    """
    if settings.credits_db_url:
        return with_password(
            settings.credits_db_url, settings.credits_db_password, "GPUHUB_CREDITS_DB_PASSWORD"
        )
    if not settings.credits or settings.credits_url:
        return None
    return f"sqlite:///{Path(settings.state_dir) / 'credits.sqlite'}"


def upgrade(settings: Settings, log: logging.Logger) -> list[Step]:
    """Migrate the hub database, then the credits ledger (when this deployment has one).

    Raises whatever the migration raises (an unreachable database, a refused password);
    the CLI prints it as one line.  Back up first (docs/howto/upgrades-backups.md): a migration
    that fails half-way is rolled back only where the database has transactional DDL.
    """
    steps = []
    url = hub_db_url(settings)
    steps.append(Step("hub database", _shown(url), upgrade_hub_db(url, log)))
    ledger = credits_db_url(settings)
    if ledger is None:
        why = (
            "credits are off"
            if not settings.credits
            else "GPUHUB_CREDITS_URL is the site's own Credits API"
        )
        steps.append(Step("credits ledger", "-", f"skipped: {why}"))
    else:
        steps.append(Step("credits ledger", _shown(ledger), upgrade_credits_db(ledger)))
    return steps
