"""The GPU pool: exclusive allocation of devices to servers, keyed by server.

One pool lives in the hub process (:meth:`GPUPool.instance`), shared by every spawner.
It holds two things:

- the *inventory*: which devices exist and their health, read from NVML (or the
  explicitly configured simulation) in a worker thread and cached for
  ``refresh_interval`` seconds, so no NVML call ever blocks the hub's event loop;
- the *allocations*: which server holds which device UUIDs since when.

Allocation is atomic on the event loop: :meth:`GPUPool.allocate` awaits the (cached)
inventory first and then checks and records the allocation without yielding, so any
number of concurrent spawns cannot over-allocate or double-book a device.

A device is handed out only when it is healthy, allocatable (a whole GPU with MIG off,
or a MIG device), held by no server, and runs no compute process: a process on a device
that no server holds belongs to someone outside the hub (NVML
``nvmlDeviceGetComputeRunningProcesses``), and the lab rule "always check nvidia-smi
first" becomes this check.

Allocations are not persisted here: spawners keep theirs in spawner state and in labels
on their containers, and give them back with :meth:`GPUPool.restore` after a hub restart
(see :mod:`hub_ext.docker.reconcile`).

This module holds the allocations and the refusals, in sentences a member reads; the
inventory reads and each unit's state (free, held, outside, unhealthy) are in
:mod:`hub_ext.docker.pool_devices`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from traitlets import Float, Int, Unicode, default, validate
from traitlets.config import SingletonConfigurable

from ..common import metrics
from ..common.clock import now
from ..common.server_key import ServerKey
from .inventory import Device, Inventory, InventoryError, allocatable_units
from .pool_devices import PoolDevices, PoolSummary, unit_state

__all__ = [
    "Allocation",
    "AllocationRefused",
    "GPUPool",
    "PoolSummary",
    "ServerKey",
    "gpu_units_of",
    "unit_state",
]


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


@dataclass
class Allocation:
    """Devices held by one server.

    ``since`` is seconds since the epoch.  ``known`` is False for an allocation rebuilt
    from a container the hub has no server for (reported, and kept busy until the
    container is gone).  ``starting`` is True from :meth:`GPUPool.allocate` until the
    spawner's start finishes; reconciliation leaves such an allocation alone.
    """

    owner: ServerKey
    uuids: tuple[str, ...]
    since: float
    profile: str = ""
    known: bool = True
    starting: bool = False

    def to_state(self) -> dict:
        """Shape kept in spawner state (version 1)."""
        return {
            "version": 1,
            "uuids": list(self.uuids),
            "since": self.since,
            "profile": self.profile,
        }


class GPUPool(PoolDevices, SingletonConfigurable):
    """Exclusive, concurrency-safe allocation of GPUs to servers."""

    inventory_class = Unicode(
        "nvml",
        config=True,
        help="""Where devices come from: "nvml" (the driver, through pynvml) or "simulated"
        (a JSON file or a count, for demos and tests without GPUs).

            c.GPUPool.inventory_class = "simulated"
        """,
    )

    @validate("inventory_class")
    def _check_inventory_class(self, proposal):
        value = proposal["value"]
        if value not in {"nvml", "simulated"}:
            raise ValueError(f"c.GPUPool.inventory_class = {value!r}: use 'nvml' or 'simulated'")
        return value

    simulated_devices = Unicode(
        "",
        config=True,
        help="""For the simulated inventory: a path to a JSON device list (the schema in
        hub_ext.docker.inventory) or a number of idle GPUs.

            c.GPUPool.simulated_devices = "2"
        """,
    )

    refresh_interval = Float(
        2.0,
        config=True,
        help="""Seconds an inventory read is reused before NVML is asked again.

            c.GPUPool.refresh_interval = 2.0
        """,
    )

    max_gpus_per_user = Int(
        0,
        config=True,
        help="""The most GPUs (or MIG devices) one user may hold across all their servers;
        0 means no limit.

            c.GPUPool.max_gpus_per_user = 2
        """,
    )

    reconcile_interval = Float(
        30.0,
        config=True,
        help="""Seconds between passes that free devices whose container is gone and report
        containers holding devices the hub does not know (hub_ext.docker.reconcile).

            c.GPUPool.reconcile_interval = 30
        """,
    )

    inventory = None  # an Inventory; built from the traits on first use

    @default("log")
    def _default_log(self):
        from traitlets import log

        return log.get_logger()

    def __init__(self, inventory: Inventory | None = None, **kwargs):
        super().__init__(**kwargs)
        self.inventory = inventory or self._make_inventory()
        self.allocations: dict[ServerKey, Allocation] = {}
        self._devices: list[Device] = []
        self._read_at = float("-inf")
        self._reading: asyncio.Future | None = None
        self._error: str = ""
        self._reconciler: asyncio.Task | None = None  # see reconcile.ensure_reconciler
        self._version = 0  # bumped on every allocation change
        self._free_cache: dict = {}
        #: called with each released Allocation (see :meth:`release`)
        self.on_release: list = []
        #: starts admitted by the hub's early refusal that have not reserved yet: owner ->
        #: its spawner, whose ``gpu_claim`` says what it claims (hub_ext.docker.spawner)
        self.claims: dict[ServerKey, object] = {}
        #: units closed to a member by the reservations' open windows: a function of
        #: (user, units) returning (count, the sentence why), or None
        #: (:meth:`hub_ext.reservations.enforce.Reservations.closed_to`)
        self.closure = None

    # -- allocation --------------------------------------------------------------------

    def _held(self) -> dict[str, ServerKey]:
        return {uuid: a.owner for a in self.allocations.values() for uuid in a.uuids}

    async def allocate(
        self,
        owner: ServerKey,
        count: int = 1,
        *,
        mig_profile: str | None = None,
        profile: str = "",
    ) -> Allocation:
        """Reserve ``count`` whole GPUs (or ``count`` MIG devices of ``mig_profile``)
        for ``owner``.

        Idempotent for an owner that already holds an allocation of that size (a retried
        start).  Raises :class:`AllocationRefused` with a sentence for the member when too
        few devices are free or the user's limit would be passed.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        try:
            devices = await self.devices()
        except InventoryError as e:
            metrics.ALLOCATIONS_REFUSED.labels(reason="inventory_error").inc()
            raise AllocationRefused(
                "inventory_error",
                "The GPUs of this node cannot be read right now. Try the CPU profile, "
                "or ask an admin to check the GPU driver.",
            ) from e
        return self.take(devices, owner, count, mig_profile=mig_profile, profile=profile)

    def take(
        self,
        devices: list[Device],
        owner: ServerKey,
        count: int = 1,
        *,
        mig_profile: str | None = None,
        profile: str = "",
    ) -> Allocation:
        """:meth:`allocate` on an inventory read already made, without yielding to the
        event loop (so the check and the record are atomic).  The line's grants use it
        (:mod:`hub_ext.docker.line`).  Raises :class:`AllocationRefused`."""
        existing = self.allocations.get(owner)
        if existing is not None:
            if len(existing.uuids) == count:
                # a retried start, or a start after a stop that left the old container
                # behind: the new container replaces it (same name) and takes its devices
                existing.known, existing.starting = True, True
                return existing
            self.release(owner)
        refused = self.refusal(devices, owner, count, mig_profile=mig_profile)
        if refused is not None:
            metrics.ALLOCATIONS_REFUSED.labels(reason=refused.reason).inc()
            raise refused
        free = self._free_units(devices, mig_profile)
        allocation = Allocation(
            owner=owner,
            uuids=tuple(d.uuid for d in free[:count]),
            since=now(),
            profile=profile,
            starting=True,
        )
        self.allocations[owner] = allocation
        self._update_metrics()
        return allocation

    def release(self, owner: ServerKey) -> Allocation | None:
        """Give back what ``owner`` holds.  Idempotent: releasing twice returns None.

        The listeners in ``on_release`` (the line, which hands the freed units to its
        head) are called before this returns, with no await in between."""
        allocation = self.allocations.pop(owner, None)
        if allocation is not None:
            self._update_metrics()
            for listener in list(self.on_release):
                try:
                    listener(allocation)
                except Exception:  # noqa: BLE001 - a release never fails
                    self.log.exception("A release listener failed for %s", owner)
        return allocation

    def held_by(self, user: str) -> int:
        """Units ``user`` holds across all their servers."""
        return sum(len(a.uuids) for a in self.allocations.values() if a.owner.user == user)

    def disown(self, owner: ServerKey) -> Allocation | None:
        """Keep ``owner``'s devices busy as held by a container the hub no longer runs
        (a stop that Docker failed): reconciliation frees them once the container is
        gone.  Returns the allocation, or None when ``owner`` held nothing."""
        allocation = self.allocations.get(owner)
        if allocation is not None:
            allocation.known = False
            allocation.starting = False
        return allocation

    def restore(
        self,
        owner: ServerKey,
        uuids: Iterable[str],
        since: float,
        profile: str = "",
        known: bool = True,
    ) -> Allocation:
        """Record an allocation that exists already (spawner state, container labels).

        A device claimed by two owners is a double booking the hub cannot resolve
        alone: the later claim is logged as an error and keeps only the devices nobody
        else holds.
        """
        held = self._held()
        mine = []
        for uuid in uuids:
            other = held.get(uuid)
            if other is not None and other != owner:
                self.log.error(
                    "GPU %s is claimed by %s and by %s; keeping it with %s",
                    uuid,
                    other,
                    owner,
                    other,
                )
                continue
            mine.append(uuid)
        current = self.allocations.get(owner)
        if current is not None and set(current.uuids) == set(mine):
            if known and not current.known:
                current.known = True
            return current
        allocation = Allocation(owner, tuple(mine), since, profile, known)
        self.allocations[owner] = allocation
        self._update_metrics()
        return allocation

    def holder(self, uuid: str) -> Allocation | None:
        """The allocation holding device ``uuid``, if any."""
        for allocation in self.allocations.values():
            if uuid in allocation.uuids:
                return allocation
        return None

    # -- refusals ------------------------------------------------------------------

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


def gpu_units_of(pool: GPUPool | None = None):
    """``c.Culler.gpu_units`` for the Docker backend: an async function of the hub's
    config returning the node's allocatable units (:class:`Device`: ``uuid``,
    ``utilization_pct``, NVML's last sample) from ``pool``, or from the hub's own pool
    (:meth:`GPUPool.instance`) when None.  It raises InventoryError when NVML cannot be
    read."""

    async def read(config) -> list[Device]:
        return list(allocatable_units(await (pool or GPUPool.instance(config=config)).devices()))

    return read
