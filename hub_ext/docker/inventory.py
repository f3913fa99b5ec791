"""What GPUs a node has: the device model, and where the list of devices comes from.

An *inventory* answers one question, synchronously and possibly slowly: which devices are
there right now, with their memory, utilization, processes and health.  The pool
(:mod:`hub_ext.docker.pool`) calls :meth:`Inventory.read` in a worker thread and caches the answer,
so an inventory may block.

Two inventories exist:

- :class:`hub_ext.docker.nvml.NVMLInventory` reads the driver through pynvml (the ``nvidia-ml-py``
  module), the production path.
- :class:`SimulatedInventory` reads a JSON file, for demos and tests on machines without
  a GPU.  It is only ever used when configured explicitly
  (``c.GPUPool.inventory_class = "simulated"``); it is never a silent fallback.

The simulated inventory and the NVML stand-in library used by the tests share one JSON
schema, so a test can describe a node once and read it either way::

    {"devices": [
      {"uuid": "GPU-5a1e...", "name": "NVIDIA A100-SXM4-40GB",
       "memory_total_mib": 40960, "memory_used_mib": 0,
       "utilization_gpu": 0, "temperature": 31,
       "processes": [{"pid": 4242, "used_memory_mib": 1024}],
       "ecc_uncorrected_volatile": 0,
       "lost": false,
       "mig_mode": false,
       "mig_devices": [{"uuid": "MIG-...", "profile": "1g.5gb", "memory_total_mib": 4864,
                        "memory_used_mib": 0, "processes": []}]}
    ]}

Every key but ``uuid`` is optional.  Devices are identified by UUID (``GPU-...`` for a
whole GPU, ``MIG-...`` for a MIG device) and never by index: indexes change between reboots
and inside containers (NVML reference, ``nvmlDeviceGetUUID``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

__all__ = [
    "Device",
    "GPUProcess",
    "Inventory",
    "InventoryError",
    "SimulatedInventory",
    "allocatable_units",
    "devices_from_json",
]


class InventoryError(RuntimeError):
    """The inventory cannot be read at all (no driver, unreadable file).

    A single sick device is not an error: it is reported as a :class:`Device` with
    ``healthy=False``.
    """


@dataclass(frozen=True)
class GPUProcess:
    """A compute process running on a device, as NVML reports it.

    ``pid`` is in the host's PID namespace; ``used_memory_mib`` is None where the driver
    does not say (NVML returns ``NVML_VALUE_NOT_AVAILABLE``, e.g. under MIG).
    """

    pid: int
    used_memory_mib: int | None = None


@dataclass(frozen=True)
class Device:
    """One GPU, or one MIG device of a GPU.

    Units: memory in MiB, utilization in percent (0-100, over NVML's last sample period),
    temperature in degrees Celsius.  A value the driver cannot give is None.

    A whole GPU with ``mig_mode=True`` is not allocatable itself; its ``mig_devices``
    are (see :func:`allocatable_units`).  A MIG device carries ``parent_uuid`` and its
    ``mig_profile`` (the slice size, e.g. ``"1g.5gb"``).
    """

    uuid: str
    index: int = 0
    name: str = "GPU"
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    processes: tuple[GPUProcess, ...] = ()
    healthy: bool = True
    health_reason: str = ""
    mig_mode: bool = False
    mig_devices: tuple[Device, ...] = ()
    parent_uuid: str | None = None
    mig_profile: str | None = None

    @property
    def is_mig(self) -> bool:
        """True for a MIG device (a slice of a GPU)."""
        return self.parent_uuid is not None

    def to_dict(self) -> dict:
        """A JSON-ready dict (for the admin API, ``gpuhub gpus --json``)."""
        return {
            "uuid": self.uuid,
            "index": self.index,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_mib": self.memory_used_mib,
            "utilization_pct": self.utilization_pct,
            "temperature_c": self.temperature_c,
            "processes": [
                {"pid": p.pid, "used_memory_mib": p.used_memory_mib} for p in self.processes
            ],
            "healthy": self.healthy,
            "health_reason": self.health_reason,
            "mig_mode": self.mig_mode,
            "mig_devices": [m.to_dict() for m in self.mig_devices],
            "parent_uuid": self.parent_uuid,
            "mig_profile": self.mig_profile,
        }


def allocatable_units(devices: Iterable[Device]) -> Iterator[Device]:
    """The units a server can be given: whole GPUs with MIG off, and MIG devices.

    A MIG device of an unhealthy GPU is reported unhealthy too.
    """
    for device in devices:
        if not device.mig_mode:
            yield device
            continue
        for mig in device.mig_devices:
            if device.healthy:
                yield mig
            else:
                yield _replace(mig, healthy=False, health_reason=device.health_reason)


def _replace(device: Device, **changes) -> Device:
    from dataclasses import replace

    return replace(device, **changes)


class Inventory:
    """Where the device list comes from.  Subclasses implement :meth:`read`.

    ``kind`` names the source for people ("nvml", "simulated"); the hub shows it, so a
    simulated node is always labelled as such.
    """

    kind = "abstract"

    def read(self) -> list[Device]:
        """Return every GPU on this node, MIG devices nested in their GPU.

        Blocking; the pool runs it in a thread.  Raises :class:`InventoryError` when the
        source cannot be read at all.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release what :meth:`read` opened (NVML handles).  Idempotent."""


def _process(entry: dict) -> GPUProcess:
    return GPUProcess(pid=int(entry["pid"]), used_memory_mib=entry.get("used_memory_mib"))


def _health(entry: dict) -> tuple[bool, str]:
    if entry.get("lost"):
        return False, "GPU is lost (NVML_ERROR_GPU_IS_LOST)"
    ecc = int(entry.get("ecc_uncorrected_volatile") or 0)
    if ecc > 0:
        return False, f"{ecc} volatile uncorrectable ECC error(s)"
    return True, ""


def devices_from_json(data: dict) -> list[Device]:
    """Build the device list from the shared JSON schema (see the module docstring).

    Raises :class:`InventoryError` naming the bad entry when the document is malformed.
    """
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        raise InventoryError('simulated inventory: expected {"devices": [...]} at the top')
    devices = []
    for index, entry in enumerate(data["devices"]):
        if not isinstance(entry, dict) or not entry.get("uuid"):
            raise InventoryError(f"simulated inventory: device {index} has no uuid")
        healthy, reason = _health(entry)
        lost = bool(entry.get("lost"))
        migs = tuple(
            Device(
                uuid=m["uuid"],
                index=index,
                name=f"{entry.get('name', 'GPU')} MIG {m.get('profile', '')}".strip(),
                memory_total_mib=m.get("memory_total_mib"),
                memory_used_mib=None if lost else m.get("memory_used_mib", 0),
                processes=() if lost else tuple(_process(p) for p in m.get("processes", [])),
                healthy=healthy,
                health_reason=reason,
                parent_uuid=entry["uuid"],
                mig_profile=m.get("profile"),
            )
            for m in entry.get("mig_devices", [])
        )
        devices.append(
            Device(
                uuid=entry["uuid"],
                index=int(entry.get("index", index)),
                name=entry.get("name", "Simulated GPU"),
                memory_total_mib=None if lost else entry.get("memory_total_mib", 16384),
                memory_used_mib=None if lost else entry.get("memory_used_mib", 0),
                utilization_pct=None if lost else entry.get("utilization_gpu", 0),
                temperature_c=None if lost else entry.get("temperature"),
                processes=() if lost else tuple(_process(p) for p in entry.get("processes", [])),
                healthy=healthy,
                health_reason=reason,
                mig_mode=bool(entry.get("mig_mode")),
                mig_devices=migs,
            )
        )
    return devices


def simulated_node(count: int, name: str = "Simulated GPU (no driver)") -> dict:
    """A JSON document for ``count`` idle simulated GPUs with stable UUIDs."""
    return {
        "devices": [
            {
                "uuid": f"GPU-00000000-0000-4000-8000-{i:012d}",
                "name": name,
                "memory_total_mib": 16384,
            }
            for i in range(count)
        ]
    }


@dataclass
class SimulatedInventory(Inventory):
    """Devices described by a JSON file (re-read on every :meth:`read`) or a count.

    ``path`` wins over ``count``.  Re-reading lets a test or a demo script change
    utilization or health while the hub runs.
    """

    path: str | None = None
    count: int = 0
    kind: str = field(default="simulated", init=False)

    def read(self) -> list[Device]:
        if self.path:
            try:
                with open(os.path.expanduser(self.path)) as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                raise InventoryError(f"simulated inventory {self.path}: {e}") from e
        else:
            data = simulated_node(self.count)
        return devices_from_json(data)
