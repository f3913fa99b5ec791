"""The state directory and the SQLite files in it, private to the hub's user.

The hub database and the credits ledger hold tokens' hashes, members' names and balances;
nobody but the hub's user has reason to read them.  SQLite creates a database file with
mode ``0644 & ~umask`` and gives the ``-wal``, ``-shm`` and ``-journal`` files it creates
the database file's own mode (SQLite docs, "unix VFS": journal files copy the database's
permissions), so a database file made here with mode 0600 keeps new ones private.  Files
SQLite finds already there keep their mode (a ``-wal`` left at 0644 by a hub killed with
SIGKILL, say), so :func:`private_sqlite` narrows those too.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

DIR_MODE = 0o700
FILE_MODE = 0o600
#: The files SQLite keeps beside a database (SQLite docs, "Temporary Files Used By SQLite").
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def _narrow(path: Path, mode: int) -> None:
    """Chmod ``path`` to ``mode`` if this user owns it and group or others have any bit."""
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        path.chmod(mode)


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) and leave it mode 0700; returns ``path``.

    An existing directory of this user with looser bits is narrowed to 0700; one owned by
    another user is left alone (the operator chose it).
    """
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    _narrow(path, DIR_MODE)
    return path


def private_sqlite(db_url: str) -> None:
    """Create the SQLite file of ``db_url`` empty with mode 0600 before SQLite does.

    An empty file is an empty SQLite database.  An existing file of this user is narrowed
    to 0600, and so are its existing ``-wal``, ``-shm`` and ``-journal`` files; other URLs
    (PostgreSQL, in-memory SQLite) are left alone.
    """
    url = make_url(db_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    path = Path(url.database)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        _narrow(path, FILE_MODE)
    for suffix in SQLITE_SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            _narrow(side, FILE_MODE)
