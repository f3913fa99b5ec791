"""``POST /hub/api/batchspawner``: the job's port report, the hub's own handler in place of
batchspawner's.

batchspawner's wrapper (``batchspawner.singleuser``, run in the job before JupyterLab)
picks a free port on the node and posts ``{"port": <int>}`` here with the server's API
token (``$JUPYTERHUB_API_TOKEN``); batchspawner's ``start()`` waits until the spawner's
``port`` is set.  batchspawner 1.3's own handler (``batchspawner/api.py``, appended to
JupyterHub's ``apihandlers.default_handlers`` when ``batchspawner`` is imported) assigns
*every* key of the body to the spawner (``setattr``): the token is the member's, in her own
server, so she could set ``exec_prefix`` (a command the hub runs as root), ``job_id``,
``hook_state``...  :func:`replace_batchspawner_handler` puts :class:`PortReportHandler` in
its place in that list (same route, same position, before JupyterHub reads the list in
``init_handlers``), so batchspawner's handler is never served.

The report is accepted only

- from a token that is the API token of one of the user's batch job servers (any other,
  a Docker server's included: 403);
- while that server's start is pending and its port not yet known (else 400);
- as a JSON object with exactly one key, ``port``, an integer 1-65535 (else 400 naming
  the field).

The validated port is the only value assigned to the spawner.
"""

from __future__ import annotations

import hmac
import json

from batchspawner import BatchSpawnerBase
from jupyterhub.apihandlers import APIHandler, default_handlers
from tornado import web

__all__ = ["PortReportHandler", "ROUTE", "replace_batchspawner_handler", "valid_port"]

#: The wrapper's URL under the hub's API (``url_path_join(api_url, "batchspawner")``).
ROUTE = r"/api/batchspawner"


def valid_port(body) -> int:
    """The port of a report body (parsed JSON).  Raises ``HTTPError(400)`` naming the field
    for anything but ``{"port": <int 1-65535>}``."""
    if not isinstance(body, dict):
        raise web.HTTPError(400, 'The body must be a JSON object: {"port": <1-65535>}.')
    extra = sorted(k for k in body if k != "port")
    if extra:
        raise web.HTTPError(
            400, f"{', '.join(map(str, extra))}: not accepted; a server reports only its port."
        )
    port = body.get("port")
    if type(port) is not int or not 1 <= port <= 65535:  # bool is an int subclass
        raise web.HTTPError(400, "port: must be an integer from 1 to 65535.")
    return port


class PortReportHandler(APIHandler):
    """A Slurm job's port report (module doc)."""

    async def post(self):
        token = self.get_auth_token()
        user = self.current_user
        spawner = None
        if token and user is not None and getattr(user, "kind", "user") == "user":
            for s in user.spawners.values():
                if (
                    isinstance(s, BatchSpawnerBase)
                    and s.api_token
                    and hmac.compare_digest(s.api_token, token)
                ):
                    spawner = s
                    break
        if spawner is None:
            raise web.HTTPError(403, "Only a server's own token may report its port.")
        port = valid_port(self.get_json_body())
        if spawner.pending != "spawn" or spawner.port:
            self.log.warning(
                "Port report for %s refused: its start is not pending", spawner._log_name
            )
            raise web.HTTPError(
                400,
                "port: this server is not starting; its port is reported once, while it starts.",
            )
        spawner.port = port
        self.log.info("%s reports port %d", spawner._log_name, port)
        self.set_status(201)
        self.finish(json.dumps({"message": "port recorded"}))


def replace_batchspawner_handler(handlers: list | None = None) -> None:
    """Put :class:`PortReportHandler` where batchspawner's handler is in JupyterHub's API
    handlers (``jupyterhub.apihandlers.default_handlers``, or ``handlers``), or append it
    when batchspawner registered none.  Idempotent; this module imports batchspawner, so
    its own registration (at import) cannot come after this."""
    handlers = default_handlers if handlers is None else handlers
    routes = [i for i, h in enumerate(handlers) if h[0] == ROUTE]
    for i in routes:
        handlers[i] = (ROUTE, PortReportHandler)
    if not routes:
        handlers.append((ROUTE, PortReportHandler))
