"""The GPU board for admins: who holds which GPU, how busy it is, and a stop button.

- ``GET /hub/gpus``: the page (template ``gpus.html``), one row per device (a whole GPU,
  or a MIG device): state, utilization and memory now, when it was last busy, the server
  holding it (user, server, profile, since when) and a button that stops that server
  through JupyterHub's own REST API (``DELETE /hub/api/users/<name>/server``), so the stop
  takes the usual path: pro rata credit refund, GPU back to the pool (on Slurm: the job
  cancelled).  Unhealthy devices and processes outside the hub have their rows too.
  The rows come from the backend (its spawner class's ``gpu_board(handler)``): the
  node's GPU pool (:mod:`hub_ext.docker.board`), or Slurm's nodes, jobs and queue
  (:mod:`hub_ext.slurm.board`, which adds the nodes with their state and reason, and the
  pending jobs in Slurm's order).  Below, the line of members waiting
  for a GPU (member, profile, waiting since, position), with buttons that remove a place or
  move it to the front (:mod:`hub_ext.line.handlers`); then the GPU notebook jobs queued or
  running (member, job, profile, running for, Stop: :mod:`hub_ext.jobs`); then the GPU
  kernels waiting or running (member, profile, the notebook it runs for, since, Stop:
  :mod:`hub_ext.kernels`).  The page
  refreshes itself from:
- ``GET /hub/api/gpuhub/gpus``: the same data as JSON, for scripts.

Both need the custom scope ``custom:gpuhub:gpus:read`` (JupyterHub 3+ custom scopes);
:func:`apply_admin_config` defines it and a role ``gpuhub-gpu-admins`` that gives it to the
admin groups (``GPUHUB_ADMIN_GROUPS``), since JupyterHub's own ``admin`` role cannot be
changed.  A filtered scope (a course's instructors: ``!group=<course group>``,
:mod:`hub_ext.courses.hubconfig`) sees its members' rows whole and the others' devices as
held, without who holds them (:func:`filtered`).  Anyone else gets 403.
Utilization is NVML's last sample; "last busy" is the last culler pass that saw the
device at or above ``c.Culler.busy_utilization`` (in this hub process: a restart forgets it).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import quote

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import Scope
from tornado import web

from ..common.services import CLI_SERVICE, CLI_TOKEN_FILE, ROLE_NAME

__all__ = [
    "CLI_SERVICE",
    "CLI_TOKEN_FILE",
    "GPUS_SCOPE",
    "ROLE_NAME",
    "apply_admin_config",
    "board_model",
    "handlers",
    "stop_path",
]

GPUS_SCOPE = "custom:gpuhub:gpus:read"
#: remove a place in line or move it to the front (the admin role only, not gpuhub-cli)
LINE_ADMIN_SCOPE = "custom:gpuhub:line:admin"
#: Seconds between the page's refreshes.
REFRESH_SECONDS = 5


def iso(when: datetime | float | None) -> str | None:
    """``when`` (an aware datetime, or seconds since the epoch) as ISO 8601 UTC text to
    the second, as the board's JSON carries times; None stays None."""
    if when is None:
        return None
    if isinstance(when, int | float):
        when = datetime.fromtimestamp(when, UTC)
    return when.astimezone(UTC).isoformat(timespec="seconds")


def stop_path(base_url: str, user: str, server: str = "") -> str:
    """JupyterHub's REST path that stops ``user``'s server ``server`` ("" the default)."""
    user = quote(user, safe="")
    if server:
        return f"{base_url}api/users/{user}/servers/{quote(server, safe='')}"
    return f"{base_url}api/users/{user}/server"


async def board_model(handler) -> dict:
    """The board, as the page and the API show it: the backend's part (its spawner class's
    ``gpu_board(handler)``: ``inventory``, ``error``, ``summary``, ``devices``, and on a
    cluster ``nodes`` and ``pending``), when it was read, the hub's line, and the
    reservations' open windows in words (``reserved``)."""
    from ..reservations.enforce import Reservations

    backend = handler.settings["spawner_class"]
    model = await backend.gpu_board(handler)
    model.setdefault("nodes", [])
    model.setdefault("pending", [])
    model["checked_at"] = iso(datetime.now(UTC))
    model["line"] = line_rows(handler)
    model["jobs"] = job_rows(handler)
    model["kernels"] = kernel_rows(handler)
    model["reserved"] = Reservations.instance().held_back() if Reservations.initialized() else []
    return filtered(model, handler)


def filtered(model: dict, handler) -> dict:
    """The board as a filtered ``custom:gpuhub:gpus:read`` (a course's instructors:
    ``!group=ml101``) may see it: a device held by someone outside the filter stays on the
    board as held (its state, utilization and memory: the instructor sees how many GPUs
    are taken and by how much) without its owner, server, processes or Stop; the line and
    Slurm's pending jobs keep only the filter's members.  Unfiltered: unchanged."""
    if handler.parsed_scopes.get(GPUS_SCOPE) is Scope.ALL:
        return model
    may_see = handler.get_scope_filter(GPUS_SCOPE)
    seen: dict[str, bool] = {}

    def visible(name: str | None) -> bool:
        if name not in seen:
            user = orm.User.find(handler.db, name) if name else None
            seen[name] = user is not None and bool(may_see(user, kind="user"))
        return seen[name]

    for device in model["devices"]:
        owner = device.get("owner")
        if owner and not visible(owner.get("user")):
            device["owner"] = None
            device["processes"] = []
    model["line"] = [p for p in model["line"] if visible(p.get("user"))]
    model["pending"] = [j for j in model["pending"] if visible(j.get("user"))]
    model["jobs"] = [j for j in model["jobs"] if visible(j.get("user"))]
    model["kernels"] = [k for k in model["kernels"] if visible(k.get("user"))]
    return model


def job_rows(handler) -> list[dict]:
    """The GPU notebook jobs not ended yet (:mod:`hub_ext.jobs`), oldest first: member, job
    name, profile, status, seconds running (None while queued), and the URL that stops it
    (``POST``, scope ``custom:gpuhub:jobs``)."""
    from ..common.clock import now
    from ..jobs import store

    rows = []
    for row in reversed(store.load(handler.db, statuses=store.ACTIVE)):
        running = None if row.start_time is None else max(0.0, now() - row.start_time / 1000)
        rows.append(
            {
                "user": row.user,
                "job": row.name,
                "job_id": row.id,
                "server": row.server_name,
                "profile": row.profile,
                "status": row.status,
                "running_s": running,
                "stop_url": f"{handler.hub.base_url}api/gpuhub/jobs/{row.id}/stop",
            }
        )
    return rows


def kernel_rows(handler) -> list[dict]:
    """The GPU kernels not ended yet (:mod:`hub_ext.kernels`), oldest first: member,
    profile, the notebook it runs for (workspace-relative), the member's server it runs
    for, its state, since when (running: started; waiting: created), its GPUs, and the URL
    that stops it (``DELETE``, scope ``custom:gpuhub:kernels``)."""
    from ..kernels import store
    from ..kernels.lifecycle import iso as kernel_iso

    return [
        {
            "user": row.user,
            "kernel_id": row.id,
            "server": row.server_name,
            "parent": row.parent,
            "profile": row.profile,
            "notebook": row.notebook,
            "state": row.state,
            "since": kernel_iso(row.started or row.created),
            "gpus": list(row.gpus or []),
            "stop_url": f"{handler.hub.base_url}api/gpuhub/kernels/{row.id}",
        }
        for row in store.load(handler.db, states=store.LIVE)
    ]


def line_rows(handler) -> list[dict]:
    """The line, in order, with the URLs of its actions (remove, move to front)."""
    from ..line.handlers import the_line

    rows = []
    for place in the_line(handler).describe_all():
        url = (
            f"{handler.hub.base_url}api/gpuhub/line/{quote(place['user'], safe='')}/"
            f"{quote(place['server'], safe='')}"
        )
        rows.append({**place, "remove_url": url, "front_url": url + "/front"})
    return rows


def _require_scope(handler) -> None:
    """403 without the board's scope; a filtered one (``!group=``) passes (:func:`filtered`)."""
    if GPUS_SCOPE not in handler.parsed_scopes:
        who = getattr(handler.current_user, "name", "?")
        handler.log.warning("%s may not see the GPU board (needs %s)", who, GPUS_SCOPE)
        raise web.HTTPError(403, "Only admins may see the GPU board.")


class GPUBoardHandler(BaseHandler):
    """``/hub/gpus``: the page."""

    @web.authenticated
    async def get(self):
        _require_scope(self)
        html = await self.render_template(
            "gpus.html",
            board=await board_model(self),
            refresh_seconds=REFRESH_SECONDS,
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

    from ..common.services import add_service, token_file
    from ..login.hubconfig import split_list

    custom = dict(c.JupyterHub.custom_scopes) if "custom_scopes" in c.JupyterHub else {}
    custom[GPUS_SCOPE] = {
        "description": "Read the GPU board: every device, who holds it and how busy it is.",
    }
    custom[LINE_ADMIN_SCOPE] = {
        "description": "Change the waiting line: remove any member's place, move one to the front.",
    }
    c.JupyterHub.custom_scopes = custom
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    c.JupyterHub.load_roles = [r for r in roles if r.get("name") != ROLE_NAME] + [
        {
            "name": ROLE_NAME,
            "description": "Admins of GPU Cluster Hub: see the GPU board, change the line",
            "scopes": [GPUS_SCOPE, LINE_ADMIN_SCOPE],
            "groups": split_list(settings.admin_groups),
        }
    ]
    add_service(
        c,
        {
            "name": CLI_SERVICE,
            "api_token": token_file(Path(settings.state_dir) / CLI_TOKEN_FILE),
            "display": False,
        },
        {
            "name": CLI_SERVICE,
            "description": "gpuhub gpus on the hub's machine: read the GPU board",
            "scopes": [GPUS_SCOPE],
        },
    )
