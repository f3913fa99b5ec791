"""The Docker backend's answers to the spawn page (:mod:`hub_ext.spawn.page`): free GPUs
from the node's GPU pool (:class:`hub_ext.docker.pool.GPUPool`), and what an image holds
from its labels (Docker ``inspect``); to the GPU board (:mod:`hub_ext.ops.board`); and to
a member's own GPUs (:mod:`hub_ext.ops.my_gpus`).

A mixin of :class:`hub_ext.docker.spawner.GPUDockerSpawner`: it reads ``self.pool``,
``self.line()`` and ``self.docker()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from docker.errors import APIError, NotFound

from ..common.server_key import ServerKey
from ..spawn.page import GPUsNow, SpawnPage, facts_from_labels
from ..spawn.profiles import gpu_request
from .inventory import Device, InventoryError, allocatable_units
from .pool import GPUPool


@dataclass(frozen=True)
class PoolSnapshot:
    """The pool's devices as read for one page; ``readable`` False when the inventory
    failed (``devices`` is then empty)."""

    devices: list[Device]
    readable: bool = True


class PoolAvailability(SpawnPage):
    """The spawn page of the Docker backend: free GPUs from the pool, image facts from
    Docker's labels."""

    async def gpu_snapshot(self) -> PoolSnapshot:
        """The pool's devices now; never raises (the page still renders, spawns say why)."""
        try:
            return PoolSnapshot(await self.pool.devices())
        except Exception as e:  # noqa: BLE001
            self.log.warning("GPU inventory unavailable for the spawn page: %s", e)
            return PoolSnapshot([], readable=False)

    def gpus_now(self, snapshot: PoolSnapshot, overrides: dict) -> GPUsNow:
        """The profile's whole GPUs or MIG slices (``gpus``), free (less those reserved for
        a group this member is not in) and in all on this node, the pool's refusal
        sentence when too few are free, and the line's length."""
        count, mig = gpu_request(overrides.get("gpus", self._configured["gpus"]))
        summary = self.pool.summary(snapshot.devices, mig_profile=mig)
        refusal = (
            self.pool.refusal_message(snapshot.devices, count, mig)
            if count and summary.free < count
            else ""
        )
        # units reserved for a group this member is not in count as taken, with the reason
        closed, why = self.pool.closed_to(self.user.name, mig) if count else (0, "")
        free = max(0, summary.free - closed)
        if count and not refusal and free < count:
            refusal = self.pool.reserved_message(count, mig, free, why)
        return GPUsNow(
            count=count,
            kind=mig or "",
            mig=bool(mig),
            free=free,
            total=summary.total,
            simulated=summary.kind == "simulated",
            refusal=refusal,
            can_wait=bool(summary.total),
            waiting=self.line().waiting(mig or "gpu") if count else 0,
        )

    def limits_of(self, overrides: dict) -> tuple:
        """The profile's JupyterHub ``mem_limit`` and ``cpu_limit``, which the container
        gets (DockerSpawner)."""
        return overrides.get("mem_limit"), overrides.get("cpu_limit")

    @classmethod
    async def availability(cls, config, log) -> dict:
        """Counts over every unit of the hub's pool, for ``/hub/api/gpuhub/availability``
        (a class method: a service asks too, with no spawner of its own)."""
        # the hub's own config: whichever of the endpoint and the spawners makes the pool
        # first, it is made the same way
        pool = GPUPool.instance(config=config)
        try:
            await pool.devices()
        except Exception:  # noqa: BLE001 - answer with what is known; spawns say why
            log.warning("GPU inventory unavailable for the availability endpoint")
        summary = pool.summary()
        return {
            "inventory": summary.kind,
            "total": summary.total,
            "free": summary.free,
            "allocated": summary.allocated,
            "outside": summary.outside,
            "unhealthy": summary.unhealthy,
            "error": pool.last_error,
        }

    @classmethod
    async def gpu_board(cls, handler) -> dict:
        """The GPU board's rows for this node (:mod:`hub_ext.docker.board`)."""
        from .board import board_model

        return await board_model(handler)

    @classmethod
    async def held_gpus(cls, handler, user, servers: list[str]) -> list[dict]:
        """The units the pool has allocated to ``user``'s ``servers``, with NVML's last
        read of each (``c.GPUPool.refresh_interval``; no NVML call on the event loop),
        ``simulated`` when the pool's inventory is the configured simulation."""
        pool = GPUPool.instance(config=handler.settings["config"])
        allocations = [pool.allocations.get(ServerKey(user.name, name)) for name in servers]
        # a container the hub has no server for (left from a crash) is nobody's to read
        held = [(a.owner.server, a) for a in allocations if a is not None and a.known]
        if not held:
            return []
        try:
            devices = await pool.devices()
        except InventoryError as e:
            handler.log.warning("GPU inventory unavailable for %s's GPUs: %s", user.name, e)
            devices = []
        units = {unit.uuid: unit for unit in allocatable_units(devices)}
        simulated = pool.inventory.kind == "simulated"
        rows = []
        for name, allocation in held:
            for uuid in allocation.uuids:
                unit = units.get(uuid)
                rows.append(
                    {
                        "uuid": uuid,
                        "name": unit.name if unit else "GPU",
                        "held_by": name,
                        "utilization_pct": unit.utilization_pct if unit else None,
                        "memory_used_mib": unit.memory_used_mib if unit else None,
                        "memory_total_mib": unit.memory_total_mib if unit else None,
                        "simulated": simulated,
                    }
                )
        return rows

    #: image name -> (time.monotonic() of the read, facts); shared by every spawner
    _image_facts: dict[str, tuple[float, dict]] = {}
    #: seconds an image's facts are reused before Docker is asked again (a rebuilt tag)
    image_facts_max_age = 60.0

    async def image_facts(self, image: str) -> dict:
        """What an image contains, from its labels, read at most once a minute per image
        (the spawn page polls; Docker is not asked for every card of every poll).

        Returns {"python", "framework", "framework_version", "cuda", "description"};
        ``{}`` when the image is not on this node.
        """
        cached = self._image_facts.get(image)
        if cached is not None and time.monotonic() - cached[0] < self.image_facts_max_age:
            return cached[1]
        try:
            info = await self.docker("inspect_image", image)
        except (NotFound, APIError):
            facts = {}
        else:
            facts = facts_from_labels((info.get("Config") or {}).get("Labels") or {})
        self._image_facts[image] = (time.monotonic(), facts)
        return facts
