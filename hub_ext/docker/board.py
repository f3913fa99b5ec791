"""The Docker backend's rows of the GPU board (:mod:`hub_ext.ops.board`): one per allocatable
unit of the node's GPU pool (a whole GPU, or a MIG device), with NVML's utilization and
memory, the culler's "last busy", and the server holding it."""

from __future__ import annotations

from datetime import datetime

from ..ops.board import iso, stop_path
from .inventory import Device, allocatable_units
from .pool import GPUPool, unit_state


def board(
    devices: list[Device], holder, last_busy: dict[str, datetime], server_view, base_url: str
) -> list[dict]:
    """One JSON-ready row per allocatable unit.

    ``holder(uuid)`` gives the :class:`~hub_ext.docker.pool.Allocation` holding a device (or
    None), ``last_busy`` maps device UUIDs to when they were last seen busy, and
    ``server_view(owner)`` what the culler knows of a server (or None).  Times are ISO 8601
    UTC; memory in MiB; utilization in percent (None where NVML does not say).  A server
    the hub does not know (a container left from a crash) has no ``stop_url``.
    """
    rows = []
    for unit in allocatable_units(devices):
        allocation = holder(unit.uuid)
        owner = None
        if allocation is not None:
            view = server_view(allocation.owner) or {}
            owner = {
                "user": allocation.owner.user,
                "server": allocation.owner.server,
                "profile": allocation.profile,
                "since": iso(allocation.since),
                "known": allocation.known,
                "stop_url": (
                    stop_path(base_url, allocation.owner.user, allocation.owner.server)
                    if allocation.known
                    else None
                ),
                "limits": view.get("limits"),
                "gpu_idle_for": view.get("gpu_idle_for"),
            }
        rows.append(
            {
                "uuid": unit.uuid,
                "index": unit.index,
                "name": unit.name,
                "mig_profile": unit.mig_profile,
                "state": unit_state(unit, allocation is not None),
                "health_reason": unit.health_reason,
                "utilization_pct": unit.utilization_pct,
                "memory_used_mib": unit.memory_used_mib,
                "memory_total_mib": unit.memory_total_mib,
                "last_busy": iso(last_busy.get(unit.uuid)),
                "processes": [
                    {"pid": p.pid, "used_memory_mib": p.used_memory_mib} for p in unit.processes
                ],
                "owner": owner,
            }
        )
    return rows


async def board_model(handler) -> dict:
    """The board of this hub's node: inventory kind, error, summary and device rows."""
    from ..culling.culler import Culler

    pool = GPUPool.instance()
    culler = Culler.instance(config=handler.settings.get("config"))
    culler.ensure_loop()  # "last busy" is tracked by its passes
    try:
        devices = await pool.devices()
    except Exception as e:  # noqa: BLE001 - show the error on the board instead
        handler.log.warning("GPU inventory unavailable for the GPU board: %s", e)
        devices = []
    summary = pool.summary(devices)
    return {
        "inventory": summary.kind,
        "error": pool.last_error,
        "summary": {
            key: getattr(summary, key)
            for key in ("total", "free", "allocated", "outside", "unhealthy")
        },
        "devices": board(
            devices,
            pool.holder,
            culler.activity.last_busy,
            culler.server_view,
            handler.hub.base_url,
        ),
    }
