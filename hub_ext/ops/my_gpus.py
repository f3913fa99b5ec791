"""``GET /hub/api/gpuhub/gpus/mine``: the GPUs a member's own server and its GPU kernels
hold, with their utilisation and memory now, for JupyterLab's status bar (the image's
``gpuhub_lab`` server extension asks with the server's own token; docs:
reference/rest-api, "Your GPUs").

Who sees what is JupyterHub RBAC, through the custom scope :data:`MINE_SCOPE`:

- the default ``user`` role holds it filtered ``!user`` (a member's own browser or API
  token: every server of hers, kernels and notebook jobs included);
- each server's token holds it filtered ``!server`` (``c.Spawner.server_token_scopes``),
  which JupyterHub resolves, when it makes the token, to that one server
  (``!server=alice/``): the token sees that server's GPUs and those of its GPU kernels,
  the member's named servers ``kernel-<id>`` whose ``user_options["kernel"]["parent"]``
  is that server (GPU kernels: issue 29);
- nobody else holds it.  Whatever the filter, only the requesting member's own servers
  are read: a service, or a token of another member's server, gets an empty list, never
  a GPU it does not hold.

The figures come from the backend (its spawner class's ``held_gpus(handler, user,
servers)``, :class:`hub_ext.spawn.page.SpawnPage`): on Docker the pool's devices as NVML
(or the configured simulation) last read them, on Slurm the GPUs of the servers' jobs
(``scontrol``), without figures.  A row::

    {"uuid", "name", "held_by": "<server name>", "utilization_pct": int|None,
     "memory_used_mib": int|None, "memory_total_mib": int|None, "simulated": bool}
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import Scope
from tornado import web

from ..common.runs import KERNEL_PREFIX
from ..common.services import define_scope, grant_scope

__all__ = ["MINE_SCOPE", "apply_my_gpus_config", "handlers", "held_servers"]

MINE_SCOPE = "custom:gpuhub:gpus:mine"
#: the scopes of JupyterHub's default ``server`` role (its server tokens' when nothing is set)
SERVER_ROLE = ("users:activity!user", "access:servers!server")


def kernel_parent(name: str, user_options) -> str | None:
    """The server a GPU kernel's server ``name`` runs for (its ``user_options["kernel"]
    ["parent"]``, "" the default server), or None when ``name`` is no GPU kernel's."""
    if not name.startswith(KERNEL_PREFIX) or not isinstance(user_options, dict):
        return None
    kernel = user_options.get("kernel")
    parent = kernel.get("parent") if isinstance(kernel, dict) else None
    return parent if isinstance(parent, str) else None


def held_servers(user, filters) -> list[str]:
    """The names of ``user``'s servers whose GPUs a request holding :data:`MINE_SCOPE` with
    ``filters`` (its entry of ``parsed_scopes``) may read: every server of hers for
    ``!user=<her>`` (or the scope unfiltered); for ``!server=<her>/<name>``, that server and
    its GPU kernels (:func:`kernel_parent`).  ``user`` is JupyterHub's ``User`` (a service
    has no servers: [])."""
    orm_spawners = getattr(user, "orm_spawners", None)
    if orm_spawners is None:
        return []
    names = sorted(orm_spawners)
    if filters == Scope.ALL or user.name in filters.get("user", ()):
        return names
    asked = set()
    for server in filters.get("server", ()):
        owner, _, name = server.partition("/")
        if owner == user.name:
            asked.add(name)
    kernels = [
        name for name in names if kernel_parent(name, orm_spawners[name].user_options) in asked
    ]
    return sorted(asked & set(names)) + kernels


class MyGPUsHandler(APIHandler):
    """``GET /hub/api/gpuhub/gpus/mine``: ``{"gpus": [row, ...]}`` (the module doc)."""

    async def get(self):
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        filters = self.parsed_scopes.get(MINE_SCOPE)
        if filters is None:
            self.log.warning("%s may not read its GPUs (needs %s)", user.name, MINE_SCOPE)
            raise web.HTTPError(403, "This token may not read the GPUs of its servers.")
        servers = held_servers(user, filters)
        backend = self.settings["spawner_class"]
        rows = await backend.held_gpus(self, user, servers) if servers else []
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps({"gpus": rows}))


handlers = [(r"/api/gpuhub/gpus/mine", MyGPUsHandler)]


def apply_my_gpus_config(c) -> None:
    """Define :data:`MINE_SCOPE`; give it to the ``user`` role filtered ``!user`` and to
    every server's token filtered ``!server`` (added to ``c.Spawner.server_token_scopes``,
    which :func:`hub_ext.jobs.hubconfig.apply_jobs_config` sets first); add the endpoint.
    Called by :func:`hub_ext.config.apply_config` after the jobs' configuration."""
    define_scope(
        c,
        MINE_SCOPE,
        "Read the GPUs your own servers and GPU kernels hold, with their utilisation and "
        "memory (filter with !server=<name>/<server> for one server and its GPU kernels).",
    )
    member = f"{MINE_SCOPE}!user"
    if "user" not in grant_scope(c, {"user": member}, set(), "apply_my_gpus_config"):
        c.JupyterHub.load_roles = [
            *c.JupyterHub.load_roles,
            {"name": "user", "scopes": ["self", member]},
        ]
    # JupyterHub's own server role when nothing asked for more (an empty list means it)
    scopes = (
        list(c.Spawner.server_token_scopes or SERVER_ROLE)
        if "server_token_scopes" in c.Spawner
        else list(SERVER_ROLE)
    )
    server = f"{MINE_SCOPE}!server"
    c.Spawner.server_token_scopes = scopes if server in scopes else [*scopes, server]
    extra = list(c.JupyterHub.extra_handlers) if "extra_handlers" in c.JupyterHub else []
    c.JupyterHub.extra_handlers = extra + [h for h in handlers if h not in extra]
