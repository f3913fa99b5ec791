"""How many GPUs (or MIG slices of a profile) the hub has, for the reservation rules.

Backend-neutral: it asks the hub's spawner class through the seams every backend already
provides (:mod:`hub_ext.spawn.page`): ``availability(config, log)["total"]`` for whole GPUs
(the Docker backend: every whole-GPU unit of the node's pool, held, free, used outside the
hub or unhealthy; Slurm: every GPU of every node), and the GPU board's device rows
(``gpu_board(handler)["devices"]``, their ``mig_profile``) for MIG slices.  A device
that is down still counts: a reservation is a promise about the hub's GPUs, not about
this minute's health.
"""

from __future__ import annotations

__all__ = ["CapacityUnknown", "hub_capacity"]


class CapacityUnknown(Exception):
    """The backend cannot count its GPUs now (NVML unreadable, Slurm not answering);
    ``str()`` is the backend's sentence (HTTP 503)."""


async def hub_capacity(handler, mig_profile: str | None = None) -> int:
    """The hub's whole GPUs (``mig_profile`` None) or its MIG slices of ``mig_profile``,
    from the hub's spawner class (``handler.settings["spawner_class"]``).  Raises
    :class:`CapacityUnknown` when the backend reports an error and counts none."""
    backend = handler.settings["spawner_class"]
    if mig_profile is None:
        counts = await backend.availability(handler.settings["config"], handler.log)
        if counts.get("error") and not counts.get("total"):
            raise CapacityUnknown(counts["error"])
        return int(counts.get("total") or 0)
    board = await backend.gpu_board(handler)
    if board.get("error") and not board.get("devices"):
        raise CapacityUnknown(board["error"])
    return sum(1 for d in board.get("devices") or [] if d.get("mig_profile") == mig_profile)
