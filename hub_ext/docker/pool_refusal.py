"""Why a request cannot have its GPUs, in sentences a member reads.

:class:`AllocationRefused` is what the pool raises (a machine ``reason`` for metrics, a
``message`` for the member).  :class:`PoolRefusals` is a part of
:class:`hub_ext.docker.pool.GPUPool` (a mixin; the pool holds ``max_gpus_per_user``,
``allocations``, ``closure``, ``held_by()`` and the free units of
:class:`hub_ext.docker.pool_devices.PoolDevices`): it answers, without recording anything or
yielding, whether a request of ``count`` units would be refused now: the member's limit, too
few free units (those claimed by starts not yet reserved counted as held), or units closed
to the member by a group's reservation (:mod:`hub_ext.docker.pool_reservations`).
"""

from __future__ import annotations

from ..common.server_key import ServerKey
from .inventory import Device, allocatable_units

__all__ = ["AllocationRefused", "PoolRefusals"]


class AllocationRefused(Exception):
    """A spawn cannot have the GPUs it asks for.

    ``reason`` is a short machine label (``no_gpu_free``, ``user_limit``,
    ``no_such_slice``, ``inventory_error``, ``reserved``) used for metrics; ``message``
    is a sentence for the member, never a traceback.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class PoolRefusals:
    """The refusals of :class:`hub_ext.docker.pool.GPUPool`, asked before or at a reservation."""

    def refusal(
        self,
        devices: list[Device],
        owner: ServerKey,
        count: int = 1,
        *,
        mig_profile: str | None = None,
        claimed: int = 0,
    ) -> AllocationRefused | None:
        """The refusal :meth:`take` would raise for this request now, or None; records
        nothing and never yields.  ``claimed``: units of this kind promised to starts that
        have not reserved yet (:mod:`hub_ext.spawn.gate`), counted as held.

        The hub's early refusal (``GPUDockerSpawner.check_spawn``) asks it before JupyterHub
        creates anything for a start; the reservation itself (:meth:`allocate`) stays the
        authority.
        """
        existing = self.allocations.get(owner)
        if existing is not None and len(existing.uuids) == count:
            return None  # take() hands the same devices back
        if self.max_gpus_per_user:
            held_by_user = self.held_by(owner.user) - len(existing.uuids if existing else ())
            if held_by_user + count > self.max_gpus_per_user:
                return AllocationRefused(
                    "user_limit",
                    f"You already hold {held_by_user} GPU(s) and each member may hold "
                    f"{self.max_gpus_per_user}. Stop one of your other servers first.",
                )
        free = len(self._free_units(devices, mig_profile)) - claimed
        if free < count:
            return AllocationRefused(
                "no_gpu_free", self.refusal_message(devices, count, mig_profile, claimed)
            )
        closed, why = self.closed_to(owner.user, mig_profile)
        if free - closed < count:
            return AllocationRefused(
                "reserved", self.reserved_message(count, mig_profile, max(0, free - closed), why)
            )
        return None

    def closed_to(self, user: str, mig_profile: str | None = None) -> tuple[int, str]:
        """Units of this kind closed to ``user`` by the reservations (see ``closure``)
        and the sentence why; (0, "") when none."""
        if self.closure is None:
            return 0, ""
        return self.closure(user, mig_profile or "gpu")

    @staticmethod
    def reserved_message(count: int, mig_profile: str | None, left: int, why: str) -> str:
        """The sentence a member reads when the free units are reserved for a group
        they are not in (``why``: "1 GPU reserved for ML101 until 16:00 UTC")."""
        what = f"{mig_profile} GPU slices" if mig_profile else "GPUs"
        return (
            f"No GPU free for you: {why}. This profile needs {count} {what} and "
            f"{left} {'is' if left == 1 else 'are'} open to you. Try the CPU profile "
            "or come back after the reservation."
        )

    def refusal_message(
        self, devices: list[Device], count: int, mig_profile: str | None = None, claimed: int = 0
    ) -> str:
        """The sentence a member reads when ``count`` units cannot be had (``claimed``
        units promised to other starts counted as in use)."""
        units = [
            u
            for u in allocatable_units(devices)
            if (u.mig_profile == mig_profile if mig_profile else not u.is_mig)
        ]
        what = f"{mig_profile} GPU slices" if mig_profile else "GPUs"
        if not units:
            return f"No GPU free: this node has no {what}. Try the CPU profile or ask an admin."
        free = max(0, len(self._free_units(devices, mig_profile)) - claimed)
        if free == 0:
            return (
                f"No GPU free: all {len(units)} {what} are in use. "
                "Try the CPU profile or come back later."
            )
        return (
            f"No GPU free for this profile: it needs {count} {what} and only {free} "
            f"of {len(units)} are free. Try a smaller profile or come back later."
        )
