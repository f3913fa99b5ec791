"""The hub's own HTTP endpoints, registered with ``c.JupyterHub.extra_handlers``.

The GPU board for admins (``/hub/gpus`` and its JSON) lives in :mod:`hub_ext.ops.board`.

``GET /hub/api/gpuhub/availability`` answers, for the logged-in member, how many GPUs are
free now and which of their profiles can start; the spawn page polls it so nobody has to
reload.  The backend's spawner answers (``availability()``, ``profile_cards()``:
:mod:`hub_ext.spawn.page`), so the endpoint is the same on Docker and on Slurm.  It
needs login (a browser session or a token) and reveals no other member's data.

JupyterHub 3.1 deprecated ``extra_handlers`` in favour of services, but the pool lives in
the hub process (its allocations are the spawners'), so a service could only show a copy.
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from ..courses.handlers import handlers as course_handlers
from ..line.handlers import handlers as line_handlers
from ..reservations.handlers import handlers as reservation_handlers
from .board import handlers as admin_handlers


class AvailabilityHandler(APIHandler):
    """Free GPUs now, and per profile of the requesting member: can it start?"""

    async def get(self):
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "Log in to see which GPUs are free.")
        backend = self.settings["spawner_class"]
        model = {**await backend.availability(self.settings["config"], self.log), "profiles": {}}
        if getattr(user, "kind", "user") == "user":
            spawner = user.spawners[""]
            visible, _ = await spawner.get_profiles()
            for card in await spawner.profile_cards(visible):
                model["profiles"][card["slug"]] = {
                    key: card[key]
                    for key in (
                        "gpus",
                        "mig_profile",
                        "free",
                        "total",
                        "available",
                        "why_not",
                        "can_wait",
                        "credits_per_hour",
                        "choices",
                    )
                }
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(model))


handlers = [
    (r"/api/gpuhub/availability", AvailabilityHandler),
    *admin_handlers,
    *line_handlers,
    *reservation_handlers,
    *course_handlers,
]
