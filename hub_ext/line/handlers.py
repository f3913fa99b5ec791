"""The line's endpoints (``c.JupyterHub.extra_handlers``).

- ``GET /hub/api/gpuhub/line``: the places of the member who asks (position, estimate,
  time left, the sentence), or every place in order for an admin of the GPU board
  (scope ``custom:gpuhub:gpus:read``);
- ``DELETE /hub/api/gpuhub/line/<user>/<server>``: leave the line (the member) or remove a
  place (an admin: scope ``custom:gpuhub:line:admin``); ``<server>`` is empty for the
  default server.  The waiting spawn ends with a sentence saying so, and JupyterHub stops
  the pending server;
- ``POST /hub/api/gpuhub/line/<user>/<server>/front``: move a place to the front of its
  line (admins only: scope ``custom:gpuhub:line:admin``; the board's read scope, which
  the ``gpuhub-cli`` token holds too, is not enough).

A member may act on their own places only (403 otherwise); a place that does not exist is
404.  Cookie-authenticated requests need the ``_xsrf`` token, as every JupyterHub API.
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from .core import Line

__all__ = ["handlers", "home_places"]

GPUS_SCOPE = "custom:gpuhub:gpus:read"  # hub_ext.ops.board.GPUS_SCOPE (no import: no cycle)
#: hub_ext.ops.board.LINE_ADMIN_SCOPE: a write scope apart from the board's read scope, which
#: the gpuhub-cli token holds too
LINE_ADMIN_SCOPE = "custom:gpuhub:line:admin"


def the_line(handler) -> Line:
    """The hub's line, attached to the hub database."""
    line = Line.instance(config=handler.settings.get("config"))
    line.attach(handler.db)
    return line


def home_places(user) -> list[dict]:
    """``c.JupyterHub.template_vars["gpuhub_line"]``: the logged-in member's places in line
    for the home page (JupyterHub calls it with the current user, None when logged out)."""
    if user is None or getattr(user, "kind", "user") != "user":
        return []
    line = Line.instance()
    line.attach(getattr(user, "db", None))
    return line.describe_all(user.name)


class LineAPIHandler(APIHandler):
    """``GET /hub/api/gpuhub/line``."""

    async def get(self):
        who = self.current_user
        if who is None:
            raise web.HTTPError(403, "Log in to see your place in line.")
        line = the_line(self)
        admin = self.has_scope(GPUS_SCOPE)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps({"places": line.describe_all(None if admin else who.name)}))


class LinePlaceAPIHandler(APIHandler):
    """``DELETE /hub/api/gpuhub/line/<user>/<server>`` and ``POST .../front``."""

    def _place_key(self, user: str, server: str, admin_only: bool = False):
        who = self.current_user
        if who is None:
            raise web.HTTPError(403, "Log in first.")
        admin = self.has_scope(LINE_ADMIN_SCOPE)
        if not admin and (admin_only or who.name != user):
            self.log.warning("%s may not change %s's place in line", who.name, user)
            raise web.HTTPError(403, "Only admins may change other members' places.")
        line = the_line(self)
        key = next((p.key for p in line.ordered() if tuple(p.key) == (user, server)), None)
        if key is None:
            raise web.HTTPError(404, f"{user} has no place in line for server '{server}'.")
        return line, key, admin and who.name != user

    async def delete(self, user: str, server: str):
        line, key, by_admin = self._place_key(user, server)
        if by_admin:
            line.remove(key, "removed", "An admin removed your place in line.")
        else:
            line.remove(key, "left", "You left the line.")
        self.set_status(204)

    async def post(self, user: str, server: str, action: str):
        if action != "front":
            raise web.HTTPError(404)
        line, key, _ = self._place_key(user, server, admin_only=True)
        line.move_to_front(key)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(line.describe(key)))


handlers = [
    (r"/api/gpuhub/line", LineAPIHandler),
    (r"/api/gpuhub/line/([^/]+)/([^/]*)", LinePlaceAPIHandler),
    (r"/api/gpuhub/line/([^/]+)/([^/]*)/(front)", LinePlaceAPIHandler),
]
