"""The Docker backend's part of the line: the GPU pool grants freed units to its head.

:class:`PoolGrants` is the :class:`hub_ext.line.LineBackend` of the pool.  The pool calls
the line back whenever it releases an allocation (:attr:`hub_ext.docker.pool.GPUPool.on_release`),
in the same step and with no await in between, so the freed GPU is granted to the head of
the line before any newcomer's spawn can run; a newcomer finds the line not empty and
waits behind it (:meth:`hub_ext.docker.spawner.GPUDockerSpawner.reserve_gpus`).

Grants use the pool's last inventory read (no NVML call on the event loop); the line's own
checks every ``c.Line.update_interval`` seconds pick up a device that became healthy or
free in between.
"""

from __future__ import annotations

from ..common import clock
from ..line import Line, LineBackend, Place
from .pool import AllocationRefused, GPUPool, ServerKey

__all__ = ["PoolGrants", "attach_line"]


def _mig(units: str) -> str | None:
    return None if units == "gpu" else units


class PoolGrants(LineBackend):
    """Free units, grants and the running servers' expected ends, from the pool."""

    def __init__(self, pool: GPUPool, line: Line, server_limits=None):
        self.pool, self.line = pool, line
        #: ServerKey -> culling limits (dict of seconds) of a running server, or None
        self.server_limits = server_limits or (lambda key: None)
        #: the hub's :class:`hub_ext.reservations.enforce.Reservations`, once attached
        self.reservations = None

    def free_units(self, units: str) -> int:
        return self.pool.free_count(_mig(units))

    def grant(self, place: Place):
        try:
            return self.pool.take(
                self.pool._devices,
                ServerKey(*place.key),
                place.count,
                mig_profile=_mig(place.units),
                profile=place.profile,
            )
        except AllocationRefused as e:
            self.line.log.info("Cannot grant %s yet: %s", place.key, e.reason)
            return None

    def fits(self, place: Place) -> bool:
        """The per-member limit (``GPUPool.max_gpus_per_user``) leaves room for it, and
        the units not reserved for a group the member is not in, now or within the
        reservations' warning time, are enough (:mod:`hub_ext.reservations.enforce`)."""
        if not self._open_to(place):
            return False
        limit = self.pool.max_gpus_per_user
        if not limit:
            return True
        own = self.pool.allocations.get(ServerKey(*place.key))
        held = self.pool.held_by(place.key[0]) - (len(own.uuids) if own else 0)
        return held + place.count <= limit

    def _open_to(self, place: Place) -> bool:
        if self.reservations is None:
            return True
        closed, _ = self.reservations.closed_to(place.key[0], place.units, soon=True)
        return self.free_units(place.units) - closed >= place.count

    def first(self, place: Place) -> bool:
        """A member of a group whose reservation is open goes ahead of the others."""
        return self.reservations is not None and self.reservations.member_first(
            place.key[0], place.units
        )

    def ungrant(self, place: Place, grant) -> None:
        """The start was cancelled before it took its grant: the units go back."""
        if self.pool.allocations.get(ServerKey(*place.key)) is grant:
            self.pool.release(ServerKey(*place.key))

    def frees(self, units: str) -> list[tuple[float, int]]:
        now = clock.now()
        mig = _mig(units)
        kinds = {d.uuid: d.mig_profile for d in self.pool._devices}
        out = []
        for allocation in self.pool.allocations.values():
            if not allocation.uuids or kinds.get(allocation.uuids[0]) != mig:
                continue
            limits = self.server_limits(allocation.owner) or {}
            out.append(
                (self.line.expected_left(now - allocation.since, limits), len(allocation.uuids))
            )
        return out


def attach_line(pool: GPUPool, db) -> Line:
    """The hub's line, attached to ``db`` and granting from ``pool`` (once per process)."""
    line = Line.instance(config=pool.config)
    if not isinstance(line.backend, PoolGrants):
        from ..culling.culler import Culler

        def limits(key):
            if not Culler.initialized():
                return None
            view = Culler.instance().server_view(key) or {}
            return view.get("limits")

        line.backend = PoolGrants(pool, line, limits)
        pool.on_release.append(lambda allocation: line.dispatch())
    line.attach(db)
    return line
