"""The GPU board for admins: who holds which GPU, how busy it is, and a stop button.

- ``GET /hub/gpus``: the page (template ``gpus.html``), one row per device (a whole GPU,
  or a MIG device): state, utilization and memory now, when it was last busy, the server
  holding it (user, server, profile, since when) and a button that stops that server
  through JupyterHub's own REST API (``DELETE /hub/api/users/<name>/server``), so the stop
  takes the usual path: pro rata credit refund, GPU back to the pool.  Unhealthy devices
  and processes outside the hub have their rows too.  Below, the line of members waiting
  for a GPU (member, profile, waiting since, position), with buttons that remove a place or
  move it to the front (:mod:`hub_ext.line.handlers`).  The page refreshes itself from:
- ``GET /hub/api/gpuhub/gpus``: the same data as JSON, for scripts.

Both need the custom scope ``custom:gpuhub:gpus:read`` (JupyterHub 3+ custom scopes);
:func:`apply_admin_config` defines it and a role ``gpuhub-gpu-admins`` that gives it to the
admin groups (``GPUHUB_ADMIN_GROUPS``), since JupyterHub's own ``admin`` role cannot be
changed.  Anyone else gets 403.  Utilization is NVML's last sample; "last busy" is the
last culler pass that saw the device at or above ``c.Culler.busy_utilization`` (in this
hub process: a restart forgets it).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import quote

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.base import BaseHandler
from tornado import web

from .docker.inventory import Device, allocatable_units
from .docker.pool import Allocation, GPUPool, unit_state

__all__ = ["CLI_SERVICE", "CLI_TOKEN_FILE", "GPUS_SCOPE", "ROLE_NAME", "apply_admin_config",
           "board", "handlers"]

GPUS_SCOPE = "custom:gpuhub:gpus:read"
#: remove a place in line or move it to the front (the admin role only, not gpuhub-cli)
LINE_ADMIN_SCOPE = "custom:gpuhub:line:admin"
ROLE_NAME = "gpuhub-gpu-admins"
#: The service (no process, a token only) that ``gpuhub gpus`` reads the board as.
CLI_SERVICE = "gpuhub-cli"
#: Its token, in the state dir (mode 0600), made at the hub's first start.
CLI_TOKEN_FILE = "gpuhub-cli-token"
#: Seconds between the page's refreshes.
REFRESH_SECONDS = 5


def _iso(when: datetime | float | None) -> str | None:
    if when is None:
        return None
    if isinstance(when, int | float):
        when = datetime.fromtimestamp(when, UTC)
    return when.astimezone(UTC).isoformat(timespec="seconds")


def stop_path(base_url: str, allocation: Allocation) -> str:
    """JupyterHub's REST path that stops the server holding ``allocation``."""
    user = quote(allocation.owner.user, safe="")
    if allocation.owner.server:
        return f"{base_url}api/users/{user}/servers/{quote(allocation.owner.server, safe='')}"
    return f"{base_url}api/users/{user}/server"


def board(devices: list[Device], holder, last_busy: dict[str, datetime], server_view,
          base_url: str) -> list[dict]:
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
                "since": _iso(allocation.since),
                "known": allocation.known,
                "stop_url": stop_path(base_url, allocation) if allocation.known else None,
                "limits": view.get("limits"),
                "gpu_idle_for": view.get("gpu_idle_for"),
            }
        rows.append({
            "uuid": unit.uuid,
            "index": unit.index,
            "name": unit.name,
            "mig_profile": unit.mig_profile,
            "state": unit_state(unit, allocation is not None),
            "health_reason": unit.health_reason,
            "utilization_pct": unit.utilization_pct,
            "memory_used_mib": unit.memory_used_mib,
            "memory_total_mib": unit.memory_total_mib,
            "last_busy": _iso(last_busy.get(unit.uuid)),
            "processes": [{"pid": p.pid, "used_memory_mib": p.used_memory_mib}
                          for p in unit.processes],
            "owner": owner,
        })
    return rows


async def board_model(handler) -> dict:
    """The board of this hub's node, as the page and the API show it."""
    from .culling import Culler

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
        "summary": {key: getattr(summary, key)
                    for key in ("total", "free", "allocated", "outside", "unhealthy")},
        "checked_at": _iso(datetime.now(UTC)),
        "devices": board(devices, pool.holder, culler.activity.last_busy, culler.server_view,
                         handler.hub.base_url),
        "line": line_rows(handler),
    }


def line_rows(handler) -> list[dict]:
    """The line, in order, with the URLs of its actions (remove, move to front)."""
    from .line.handlers import the_line

    rows = []
    for place in the_line(handler).describe_all():
        url = (f"{handler.hub.base_url}api/gpuhub/line/{quote(place['user'], safe='')}/"
               f"{quote(place['server'], safe='')}")
        rows.append({**place, "remove_url": url, "front_url": url + "/front"})
    return rows


def _require_scope(handler) -> None:
    if not handler.has_scope(GPUS_SCOPE):
        who = getattr(handler.current_user, "name", "?")
        handler.log.warning("%s may not see the GPU board (needs %s)", who, GPUS_SCOPE)
        raise web.HTTPError(403, "Only admins may see the GPU board.")


class GPUBoardHandler(BaseHandler):
    """``/hub/gpus``: the page."""

    @web.authenticated
    async def get(self):
        _require_scope(self)
        html = await self.render_template(
            "gpus.html", board=await board_model(self), refresh_seconds=REFRESH_SECONDS,
            api_url=self.hub.base_url + "api/gpuhub/gpus",
        )
        self.finish(html)


class GPUBoardAPIHandler(APIHandler):
    """``/hub/api/gpuhub/gpus``: the board as JSON."""

    async def get(self):
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        _require_scope(self)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(await board_model(self)))


handlers = [(r"/gpus", GPUBoardHandler), (r"/api/gpuhub/gpus", GPUBoardAPIHandler)]


def apply_admin_config(c, settings) -> None:
    """Define the board's custom scope, the role that gives it to the admin groups, and the
    service ``gpuhub-cli`` whose token (``<state dir>/gpuhub-cli-token``, 0600) lets
    ``gpuhub gpus`` on this machine read the board and nothing else."""
    from pathlib import Path

    from .auth_config import split_list
    from .services import add_service, token_file

    custom = dict(c.JupyterHub.custom_scopes) if "custom_scopes" in c.JupyterHub else {}
    custom[GPUS_SCOPE] = {
        "description": "Read the GPU board: every device, who holds it and how busy it is.",
    }
    custom[LINE_ADMIN_SCOPE] = {
        "description": "Change the waiting line: remove any member's place, move one to "
                       "the front.",
    }
    c.JupyterHub.custom_scopes = custom
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    c.JupyterHub.load_roles = [r for r in roles if r.get("name") != ROLE_NAME] + [{
        "name": ROLE_NAME,
        "description": "Admins of GPU Cluster Hub: see the GPU board, change the line",
        "scopes": [GPUS_SCOPE, LINE_ADMIN_SCOPE],
        "groups": split_list(settings.admin_groups),
    }]
    add_service(c, {
        "name": CLI_SERVICE,
        "api_token": token_file(Path(settings.state_dir) / CLI_TOKEN_FILE),
        "display": False,
    }, {
        "name": CLI_SERVICE,
        "description": "gpuhub gpus on the hub's machine: read the GPU board",
        "scopes": [GPUS_SCOPE],
    })
