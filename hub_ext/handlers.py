"""The hub's own HTTP endpoints, registered with ``c.JupyterHub.extra_handlers``.

The GPU board for admins (``/hub/gpus`` and its JSON) lives in :mod:`hub_ext.admin`.

``GET /hub/api/gpuhub/availability`` answers, for the logged-in member, how many GPUs are
free now and which of their profiles can start; the spawn page polls it so nobody has to
reload.  It needs login (a browser session or a token) and reveals no other member's data.

JupyterHub 3.1 deprecated ``extra_handlers`` in favour of services, but the pool lives in
the hub process (its allocations are the spawners'), so a service could only show a copy.
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from .admin import handlers as admin_handlers
from .docker.pool import GPUPool
from .line.handlers import handlers as line_handlers


class AvailabilityHandler(APIHandler):
    """Free GPUs now, and per profile of the requesting member: can it start?"""

    async def get(self):
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "Log in to see which GPUs are free.")
        # the hub's own config: whichever of this handler and the spawners makes the
        # pool first, it is made the same way
        pool = GPUPool.instance(config=self.settings["config"])
        try:
            await pool.devices()
        except Exception:  # noqa: BLE001 - answer with what is known; spawns say why
            self.log.warning("GPU inventory unavailable for the availability endpoint")
        summary = pool.summary()
        model = {"inventory": summary.kind, "total": summary.total, "free": summary.free,
                 "allocated": summary.allocated, "outside": summary.outside,
                 "unhealthy": summary.unhealthy, "error": pool.last_error, "profiles": {}}
        if getattr(user, "kind", "user") == "user":
            spawner = user.spawners[""]
            visible, _ = await spawner.get_profiles()
            for card in await spawner.profile_cards(visible):
                model["profiles"][card["slug"]] = {
                    key: card[key] for key in ("gpus", "mig_profile", "free", "total",
                                               "available", "why_not", "can_wait",
                                               "credits_per_hour", "choices")
                }
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(model))


handlers = [(r"/api/gpuhub/availability", AvailabilityHandler), *admin_handlers,
            *line_handlers]
