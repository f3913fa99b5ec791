"""Reconcile the pool's allocations with the containers Docker really runs.

The pool's books are rebuilt from two sources after a hub restart: spawner state
(:meth:`GPUDockerSpawner.load_state`) and the labels every server container carries
(``io.gpuhub.hub``, ``.user``, ``.server``, ``.devices``, ``.since``).  A pass:

- frees the devices of an allocation whose container is gone (removed behind the hub's
  back, or never created because the hub died mid-spawn), unless its start is still in
  progress;
- keeps the devices of a running container the hub has no allocation for (a hub killed
  between ``docker create`` and saving state) busy, marked unknown, and reports it: they
  are never handed to someone else while that container runs.

It runs once at start-up and then every ``c.GPUPool.reconcile_interval`` seconds.
Docker calls run in a thread (docker-py is blocking).
"""

from __future__ import annotations

import asyncio
import logging

from ..common.periodic import ensure_task, every
from ..spawn.profiles import LABEL_PREFIX
from .pool import GPUPool, ServerKey

LIVE_STATES = {"created", "running", "restarting", "paused"}


def containers_by_owner(client, hub_id: str) -> dict[ServerKey, dict]:
    """Live containers of hub ``hub_id`` by owner: {key: {uuids, since, profile, name}}.

    Blocking (docker-py).
    """
    found = {}
    for c in client.containers(all=True, filters={"label": f"{LABEL_PREFIX}hub={hub_id}"}):
        if c.get("State") not in LIVE_STATES:
            continue
        labels = c.get("Labels") or {}
        owner = ServerKey(
            labels.get(LABEL_PREFIX + "user", ""), labels.get(LABEL_PREFIX + "server", "")
        )
        devices = [u for u in labels.get(LABEL_PREFIX + "devices", "").split(",") if u]
        try:
            since = float(labels.get(LABEL_PREFIX + "since", "0"))
        except ValueError:
            since = 0.0
        found[owner] = {
            "uuids": devices,
            "since": since,
            "profile": labels.get(LABEL_PREFIX + "profile", ""),
            "name": (c.get("Names") or ["?"])[0].lstrip("/"),
        }
    return found


async def reconcile_once(
    pool: GPUPool, client, hub_id: str, log: logging.Logger | None = None
) -> dict:
    """One pass.  Returns {"freed": [owner...], "unknown": [owner...]}.

    Only allocations that were settled (not starting) before Docker was asked are
    candidates for freeing: a server whose container appeared after the container list
    was read is never freed by this pass.
    """
    log = log or pool.log
    settled = {owner: a for owner, a in pool.allocations.items() if not a.starting}
    loop = asyncio.get_running_loop()
    live = await loop.run_in_executor(None, containers_by_owner, client, hub_id)
    freed, unknown = [], []
    for owner, allocation in settled.items():
        if owner in live or pool.allocations.get(owner) is not allocation:
            continue
        if allocation.starting:
            continue  # started again while Docker was being asked
        pool.release(owner)
        freed.append(owner)
        log.warning(
            "Freed GPU(s) %s of %s: its container is gone", ",".join(allocation.uuids), owner
        )
    for owner, info in live.items():
        if not info["uuids"]:
            continue
        current = pool.allocations.get(owner)
        if current is None:
            pool.restore(owner, info["uuids"], info["since"], info["profile"], known=False)
            current = pool.allocations[owner]
        if not current.known:
            unknown.append(owner)
            log.warning(
                "Container %s holds GPU(s) %s for %s but the hub runs no such server; "
                "the devices stay busy until it is removed",
                info["name"],
                ",".join(info["uuids"]),
                owner,
            )
    return {"freed": freed, "unknown": unknown}


async def reconcile_forever(
    pool: GPUPool, client_factory, hub_id: str, interval: float, log: logging.Logger | None = None
) -> None:
    """Run :func:`reconcile_once` now and then every ``interval`` seconds, forever; each
    pass also reads the inventory, so the ``gpuhub_gpus`` gauges are at most one interval
    old."""
    log = log or pool.log

    async def step() -> None:
        try:
            await reconcile_once(pool, client_factory(), hub_id, log)
        finally:
            try:
                await pool.devices()
            except Exception as e:  # noqa: BLE001 - logged by the pool; spawns say why
                log.debug("GPU inventory read in the reconciliation pass failed: %s", e)

    await every(lambda: interval, step, log, "GPU reconciliation pass", first_now=True)


def ensure_reconciler(pool: GPUPool, client_factory, hub_id: str) -> None:
    """Start :func:`reconcile_forever` for ``pool`` once per hub process (needs a running
    event loop); later calls find the task running and do nothing."""
    pool._reconciler = ensure_task(
        pool._reconciler,
        lambda: reconcile_forever(pool, client_factory, hub_id, pool.reconcile_interval),
    )
