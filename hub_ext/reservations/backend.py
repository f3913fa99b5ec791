"""What a backend that holds reservations itself (Slurm: its own reservations) tells the
REST endpoints (:mod:`.handlers`), and the group members it is given.

The endpoints call the spawner class's ``reservation_changed`` (a seam of
:class:`hub_ext.spawn.backend.SpawnBackend`, nothing by default) after their own checks and
before they store a change (a creation: right after, undone when the backend refuses), so
that a reservation the backend refused is not kept.
"""

from __future__ import annotations

from jupyterhub import orm
from sqlalchemy import select

__all__ = ["BackendRefused", "BackendUnavailable", "members_of"]


class BackendRefused(Exception):
    """The backend answered no (Slurm: not enough nodes, a bad user); ``str()`` carries
    its words (HTTP 409)."""


class BackendUnavailable(Exception):
    """The backend did not answer (HTTP 503)."""


def members_of(db, group: str) -> list[str]:
    """The names of ``group``'s members in the hub database, sorted; [] for no group."""
    found = db.scalars(select(orm.Group).where(orm.Group.name == group)).first()
    return sorted(u.name for u in found.users) if found is not None else []
