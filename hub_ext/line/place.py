"""A place in the line of members waiting for GPUs, and what the line asks of a backend.

:class:`Place` is one waiting server (mirrored in the hub database, :mod:`hub_ext.line.store`);
:class:`LineBackend` is what :class:`hub_ext.line.core.Line` asks of the Docker pool or of
Slurm; :class:`LineRefused` and :class:`LineLeft` end a place with a sentence for the member.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from . import store

__all__ = ["LineBackend", "LineLeft", "LineRefused", "Place", "pair", "utcnow"]


def pair(user: str, server: str) -> tuple[str, str]:
    """A place's key: (user, server name), as :class:`hub_ext.server_key.ServerKey` is."""
    return (user, server)


def utcnow() -> float:
    """Seconds since the epoch; the one clock of the line, replaced by tests."""
    return time.time()


class LineRefused(Exception):
    """A member may not join the line: ``reason`` is a metrics label (``one_per_profile``,
    ``user_limit``, ``credits``), ``message`` a sentence for the member."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


class LineLeft(Exception):
    """A place ended without a turn: ``reason`` is ``left``, ``removed``, ``expired`` or
    ``stopped``; ``message`` says so to the member."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


class LineBackend(Protocol):
    """What the line asks of a backend (the Docker pool, or Slurm)."""

    def free_units(self, units: str) -> int:
        """Units of this kind (``"gpu"`` or a MIG profile) free now, without waiting."""

    def grant(self, place: Place) -> object | None:
        """Take ``place.count`` units for ``place.key`` now; None when it cannot."""

    def fits(self, place: Place) -> bool:
        """False when ``place`` may not start yet whatever is free (the per-member
        limit): it lets the places behind it pass (:func:`hub_ext.line.order.grants`)."""

    def ungrant(self, place: Place, grant: object) -> None:
        """Give back ``grant``, made for ``place`` whose start was cancelled before it
        took the grant."""

    def frees(self, units: str) -> list[tuple[float, int]]:
        """(seconds until it frees, units) per running server of this kind."""

    # optional: a backend whose own scheduler keeps the order (Slurm) has
    # ``standing(place) -> (position, estimate in seconds or None) | None``: the place's
    # position (1 = next) and wait in that scheduler's line, which the line shows instead
    # of its own (None: not known yet, counted from the line's order), and
    # ``no_estimate``: the words for an unknown wait.


@dataclass
class Place:
    """One waiting server.  ``queued_at`` in seconds since the epoch."""

    key: tuple[str, str]  # (user, server name): hub_ext.server_key.ServerKey
    profile: str
    profile_name: str
    units: str
    count: int
    user_options: dict
    queued_at: float
    rank: float
    front: bool = False
    share_hours: float = 0.0
    waiter: asyncio.Future | None = field(default=None, repr=False)
    on_update: Callable | None = field(default=None, repr=False)

    @classmethod
    def of(cls, row: store.LineRow, key_type: Callable = pair) -> Place:
        return cls(key_type(row.username, row.server_name), row.profile,
                   row.profile_name, row.units, row.count, dict(row.user_options or {}),
                   row.queued_epoch(), row.rank, row.front, row.share_hours)

    @property
    def unit_word(self) -> str:
        return "GPU" if self.units == "gpu" else f"{self.units} GPU slice"
