"""A place in the line of members waiting for GPUs, and what the line asks of a backend.

:class:`Place` is one waiting server (mirrored in the hub database, :mod:`hub_ext.line.store`);
:class:`LineBackend` is what :class:`hub_ext.line.core.Line` asks of the Docker pool or of
Slurm; :class:`LineRefused` and :class:`LineLeft` end a place with a sentence for the member.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from ..common.server_key import ServerKey
from . import store
from .order import NO_ESTIMATE

__all__ = ["LineBackend", "LineLeft", "LineRefused", "Place", "show_changes"]


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


class LineBackend:
    """What the line asks of a backend (the Docker pool:
    :class:`hub_ext.docker.line.PoolGrants`; Slurm:
    :class:`hub_ext.slurm.line.SlurmQueue`).

    :meth:`free_units`, :meth:`grant` and :meth:`frees` are required (they raise
    NotImplementedError here); :meth:`fits`, :meth:`ungrant`, :meth:`standing` and
    :attr:`no_estimate` are optional, with the defaults documented on each.
    """

    #: Optional: the words for a wait the backend cannot estimate.
    no_estimate: str = NO_ESTIMATE

    def free_units(self, units: str) -> int:
        """Units of this kind (``"gpu"`` or a MIG profile) free now, without waiting."""
        raise NotImplementedError

    def grant(self, place: Place) -> object | None:
        """Take ``place.count`` units for ``place.key`` now; None when it cannot."""
        raise NotImplementedError

    def frees(self, units: str) -> list[tuple[float, int]]:
        """(seconds until it frees, units) per running server of this kind."""
        raise NotImplementedError

    def fits(self, place: Place) -> bool:
        """Optional: False when ``place`` may not start yet whatever is free (a
        per-member limit): it lets the places behind it pass
        (:func:`hub_ext.line.order.grants`).  Default: every place fits."""
        return True

    def ungrant(self, place: Place, grant: object) -> None:
        """Optional: give back ``grant``, made for ``place`` whose start was cancelled
        before it took the grant.  Default: nothing to give back."""

    def first(self, place: Place) -> bool:
        """Optional: ``place`` goes ahead of the places for which it is False (a member
        of a group whose reserved GPUs are open now).  Default: False for every place."""
        return False

    def standing(self, place: Place) -> tuple[int, float | None] | None:
        """Optional, for a backend whose own scheduler keeps the order (Slurm): the
        place's position (1 = next) and wait in seconds (None: unknown) in that
        scheduler's line, which the line shows instead of its own.  Default None: not
        known, the place counts in the line's own order."""
        return None


@dataclass
class Place:
    """One waiting server.  ``queued_at`` in seconds since the epoch."""

    key: ServerKey  # (user, server name); a plain tuple of the two compares equal
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
    def of(cls, row: store.LineRow) -> Place:
        return cls(
            ServerKey(row.username, row.server_name),
            row.profile,
            row.profile_name,
            row.units,
            row.count,
            dict(row.user_options or {}),
            row.queued_epoch(),
            row.rank,
            row.front,
            row.share_hours,
        )

    @property
    def unit_word(self) -> str:
        return "GPU" if self.units == "gpu" else f"{self.units} GPU slice"


def show_changes(show: Callable[[int, str], None], progress: int) -> Callable[[dict], None]:
    """A place's ``on_update`` for a waiting start: its sentence (the line's description of
    the place) told to ``show(progress, sentence)``, the progress page's event, only when
    it changed."""
    last = [""]

    def show_place(described: dict) -> None:
        sentence = described.get("sentence")
        if sentence and sentence != last[0]:
            last[0] = sentence
            show(progress, sentence)

    return show_place
