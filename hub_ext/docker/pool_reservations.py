"""The Docker backend's part of the reservations: the pool's servers and free units for
:class:`hub_ext.reservations.enforce.Reservations`, and the closure the pool consults.

:func:`attach_reservations` (called by every :class:`hub_ext.docker.spawner.GPUDockerSpawner`
that has the hub database, as the line is attached) makes the hub's ``Reservations`` read
this pool and sets ``GPUPool.closure``, so the pool's refusal (a start, a grant from the
line) counts the units closed to a member; when a window begins or ends the line is
dispatched in the same step (:meth:`PoolReservations.changed`).
"""

from __future__ import annotations

from ..reservations.enforce import ReservationBackend, Reservations
from .inventory import allocatable_units
from .pool import GPUPool

__all__ = ["PoolReservations", "attach_reservations"]


class PoolReservations(ReservationBackend):
    """Holdings and free units from the pool; the line dispatched on a change."""

    def __init__(self, pool: GPUPool, line=None):
        self.pool, self.line = pool, line

    def holdings(self) -> list[tuple]:
        kinds = {u.uuid: u.mig_profile for u in allocatable_units(self.pool._devices)}
        return [
            (a.owner, kinds.get(a.uuids[0]) or "gpu", len(a.uuids), a.since)
            for a in self.pool.allocations.values()
            if a.uuids and a.known
        ]

    async def read(self) -> None:
        """The pool's inventory, read at most ``refresh_interval`` ago (raises
        InventoryError when it was never read)."""
        await self.pool.devices()

    def free_units(self, units: str) -> int:
        return self.pool.free_count(None if units == "gpu" else units)

    def changed(self) -> None:
        if self.line is not None:
            self.line.dispatch()


def attach_reservations(pool: GPUPool, line, db, users) -> Reservations:
    """The hub's ``Reservations``, reading ``pool`` and consulted by it (once per process);
    its passes start on the first call with a running event loop."""
    rules = Reservations.instance(config=pool.config)
    if rules.backend is None:
        rules.backend = PoolReservations(pool, line)
        pool.closure = rules.closed_to
    if line is not None and getattr(line.backend, "reservations", False) is None:
        line.backend.reservations = rules
    rules.attach(rules.backend, db, users)
    return rules
