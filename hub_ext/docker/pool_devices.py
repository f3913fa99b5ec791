"""The devices as the GPU pool sees them: read from the inventory, and each unit's state.

:class:`PoolDevices` is a part of :class:`hub_ext.docker.pool.GPUPool` (a mixin; the pool
holds the traits, ``inventory``, ``allocations`` and ``_held()``).  The inventory (NVML, or
the configured simulation: :mod:`hub_ext.docker.inventory`) is read in a worker thread and
the read reused for ``c.GPUPool.refresh_interval`` seconds, concurrent callers sharing one.
Each allocatable unit (a whole GPU with MIG off, or a MIG device) is, in order of
precedence, ``unhealthy``, ``held`` by a server, ``outside`` (it runs compute processes of
no server: NVML ``nvmlDeviceGetComputeRunningProcesses``) or ``free``; the counts go to
``gpuhub_gpus{state}`` (``/hub/metrics``) and the spawn page (:class:`PoolSummary`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..common import metrics
from .inventory import Device, Inventory, InventoryError, SimulatedInventory, allocatable_units

__all__ = ["PoolDevices", "PoolSummary", "unit_state"]


def unit_state(unit: Device, held: bool) -> str:
    """A unit's state for people and metrics, in order of precedence: ``unhealthy``,
    ``held`` (by a server), ``outside`` (runs compute processes of no server) or ``free``."""
    if not unit.healthy:
        return "unhealthy"
    if held:
        return "held"
    return "outside" if unit.processes else "free"


@dataclass
class PoolSummary:
    """Counts of allocatable units (whole GPUs or MIG devices)."""

    total: int = 0
    free: int = 0
    allocated: int = 0
    outside: int = 0
    unhealthy: int = 0
    kind: str = ""
    by_slice: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class PoolDevices:
    """The inventory reads and the units' states of :class:`hub_ext.docker.pool.GPUPool`."""

    def _make_inventory(self) -> Inventory:
        if self.inventory_class == "simulated":
            spec = self.simulated_devices.strip()
            if spec.isdigit():
                return SimulatedInventory(count=int(spec))
            if not spec:
                raise ValueError(
                    'c.GPUPool.simulated_devices is empty: give a count ("2") or a JSON path'
                )
            return SimulatedInventory(path=spec)
        from .nvml import NVMLInventory

        return NVMLInventory()

    async def devices(self, max_age: float | None = None) -> list[Device]:
        """The node's devices, read at most ``max_age`` seconds ago (default
        ``refresh_interval``).

        Concurrent callers share one read.  Raises :class:`InventoryError` when the
        inventory cannot be read and no earlier read exists.
        """
        if max_age is None:
            max_age = self.refresh_interval
        if time.monotonic() - self._read_at <= max_age:
            return self._devices
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
        try:
            return await asyncio.shield(self._reading)
        finally:
            if self._reading is not None and self._reading.done():
                self._reading = None

    async def _read(self) -> list[Device]:
        loop = asyncio.get_running_loop()
        try:
            devices = await loop.run_in_executor(None, self.inventory.read)
        except InventoryError as e:
            self._error = str(e)
            self.log.error("GPU inventory (%s) cannot be read: %s", self.inventory.kind, e)
            if not self._devices:
                raise
            return self._devices
        self._error = ""
        self._devices = devices
        self._read_at = time.monotonic()
        self._update_metrics()
        return devices

    def _free_units(self, devices: list[Device], mig_profile: str | None) -> list[Device]:
        # Cached per (inventory read, allocation change, slice): a rush of refusals
        # costs one scan, not one each, so the event loop is never held for long.
        key = (id(devices), self._version, mig_profile)
        cached = self._free_cache.get(key)
        if cached is None:
            cached = self._scan_free_units(devices, mig_profile)
            self._free_cache = {key: cached}
        return list(cached)

    def _scan_free_units(self, devices: list[Device], mig_profile: str | None) -> list[Device]:
        held = self._held()
        free = []
        for unit in allocatable_units(devices):
            if not unit.healthy or unit.uuid in held or unit.processes:
                continue
            if mig_profile is None and unit.is_mig:
                continue
            if mig_profile is not None and unit.mig_profile != mig_profile:
                continue
            free.append(unit)
        # the emptiest first, then by index so that choices are stable
        free.sort(key=lambda d: (d.memory_used_mib or 0, d.index, d.uuid))
        return free

    def free_count(self, mig_profile: str | None = None) -> int:
        """Units of this kind free by the last inventory read (no NVML call)."""
        return len(self._free_units(self._devices, mig_profile))

    def summary(
        self, devices: list[Device] | None = None, mig_profile: str | None = None
    ) -> PoolSummary:
        """Counts for the spawn page and metrics, from the last inventory read."""
        devices = self._devices if devices is None else devices
        held = self._held()
        s = PoolSummary(kind=self.inventory.kind)
        for unit in allocatable_units(devices):
            if mig_profile is not None and unit.mig_profile != mig_profile:
                continue
            state = unit_state(unit, unit.uuid in held)
            if mig_profile is None and unit.is_mig:
                key = unit.mig_profile or "mig"
                s.by_slice[key] = s.by_slice.get(key, 0) + (1 if state == "free" else 0)
                continue
            s.total += 1
            field_name = "allocated" if state == "held" else state
            setattr(s, field_name, getattr(s, field_name) + 1)
        return s

    @property
    def last_error(self) -> str:
        """The last inventory error, or ``""`` when the last read worked."""
        return self._error

    def _update_metrics(self) -> None:
        self._version += 1
        s = self.summary()
        metrics.GPUS.labels(state="total").set(s.total)
        metrics.GPUS.labels(state="free").set(s.free)
        metrics.GPUS.labels(state="allocated").set(s.allocated)
        metrics.GPUS.labels(state="outside").set(s.outside)
        metrics.GPUS.labels(state="unhealthy").set(s.unhealthy)
