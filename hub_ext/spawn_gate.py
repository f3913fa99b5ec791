"""The spawn gate: a start the hub already knows it cannot make is refused before
JupyterHub's ``User.spawn`` does any work for it.

For every start, ``User.spawn`` (``jupyterhub/user.py``) adds the server's row, creates its
API token and its OAuth client and commits them, runs the authenticator's pre-spawn steps,
and only then calls ``Spawner.start()``; when ``start()`` refuses, ``User.stop`` deletes all
of it again.  Under a rush of 200 starts for 8 GPUs that database work is nearly all of
the time a refusal takes (py-spy, ``benchmarks/pool_contention.py --hub --profile``): the
pool decides in milliseconds, the refusal arrived after seconds.

The gate asks the spawner first: JupyterHub's ``spawn_single_user`` (``handlers/base.py``),
through which both the REST API (``POST /hub/api/users/:name/server[s/:server]``,
``UserServerAPIHandler.post``) and the spawn form (``POST /hub/spawn``, ``SpawnHandler``)
start servers, runs inside the spawner's ``checked_spawn(options)`` when it has one
(:meth:`hub_ext.docker.spawner.GPUDockerSpawner.checked_spawn`) for a server that is neither
running nor pending: its check first, then JupyterHub's code unchanged.  A refusal is the
``HTTPError`` that ``start()`` would raise, with the same status and words, so the API's
JSON and the spawn form's message read as before.  The check is advisory: ``start()``
checks again and the GPU pool's reservation stays the one authority over who holds a GPU.

Where the gate sits: JupyterHub routes a request to the first of its handlers whose
pattern matches (tornado ``Application``), and ``JupyterHub.init_handlers`` (``app.py``)
lists the authenticator's own handlers (``Authenticator.get_handlers``, documented for
login handlers) before its default handlers, while ``c.JupyterHub.extra_handlers`` come
after them and could never answer a route JupyterHub already has.  So the hub's
authenticator (:class:`hub_ext.auth.CreditAuthenticator`) mixes in :class:`GatedRoutes`,
which adds the two handler subclasses below for JupyterHub's own spawn routes (their
patterns read from JupyterHub's ``default_handlers``, so they cannot drift apart).
"""

from __future__ import annotations

from jupyterhub.apihandlers import users as api_users
from jupyterhub.handlers import pages

from .stopping import StopAfterCancelledStart


class SpawnGate:
    """Mixed into a JupyterHub handler: ``spawn_single_user`` runs inside the spawner's
    ``checked_spawn(options)``, which refuses first what the spawner knows it would refuse
    (``tornado.web.HTTPError``)."""

    async def spawn_single_user(self, user, server_name="", display_name="", options=None):
        spawner = user.get_or_create_spawner(server_name, display_name, replace_failed=True)
        checked = getattr(spawner, "checked_spawn", None)
        if checked is None or spawner.active:
            return await super().spawn_single_user(user, server_name, display_name,
                                                   options=options)
        async with checked(options):
            return await super().spawn_single_user(user, server_name, display_name,
                                                   options=options)


class GatedServerAPIHandler(SpawnGate, StopAfterCancelledStart,
                            api_users.UserServerAPIHandler):
    """JupyterHub's ``/hub/api/users/:name/server[s/:server]``: ``POST`` gated, ``DELETE``
    of a starting server answered once its start has cleaned up
    (:class:`hub_ext.stopping.StopAfterCancelledStart`)."""


class GatedSpawnHandler(SpawnGate, pages.SpawnHandler):
    """JupyterHub's ``/hub/spawn[/:user[/:server]]`` (the spawn form), gated."""


def gated_routes() -> list[tuple[str, type]]:
    """``(pattern, handler)`` for JupyterHub's spawn routes, with the gated handlers; the
    patterns are JupyterHub's own (``default_handlers`` of its API and page handlers),
    without the hub prefix (JupyterHub adds it to an authenticator's handlers)."""
    gated = {api_users.UserServerAPIHandler: GatedServerAPIHandler,
             pages.SpawnHandler: GatedSpawnHandler}
    return [(route[0], gated[route[1]])
            for route in [*api_users.default_handlers, *pages.default_handlers]
            if route[1] in gated]


class GatedRoutes:
    """Mixed into the hub's authenticator: its handlers, and the gated spawn routes ahead
    of JupyterHub's own (see the module doc)."""

    def get_handlers(self, app):
        return [*super().get_handlers(app), *gated_routes()]
