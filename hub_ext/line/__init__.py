"""The line of members waiting for a GPU, shared by every backend.

- :mod:`hub_ext.line.order`: the rules as pure functions (order, backfill, estimate);
- :mod:`hub_ext.line.store`: the places in the hub database;
- :mod:`hub_ext.line.core`: :class:`Line`, the places of this hub and each one's turn, with
  :mod:`hub_ext.line.view` (their order and descriptions) and :mod:`hub_ext.line.turn` (the
  grants and the waiting);
- :mod:`hub_ext.line.resume`: after a hub restart, the waiting spawns started again;
- :mod:`hub_ext.line.handlers`: the member's and the admins' endpoints.

A backend grants freed units to the line (Docker: :mod:`hub_ext.docker.line`;
Slurm: :mod:`hub_ext.slurm.line`).
"""

from .core import Line, LineBackend, LineLeft, LineRefused, Place
from .place import show_changes

__all__ = ["Line", "LineBackend", "LineLeft", "LineRefused", "Place", "show_changes"]
