"""The GPU kernels' REST endpoints (``c.JupyterHub.extra_handlers``; docs:
reference/kernels-api).

- ``GET /hub/api/gpuhub/kernels/specs``: the profiles that offer GPU kernels to the
  member, with their GPUs, price and free GPUs now (the kernelspecs her server lists);
- ``POST /hub/api/gpuhub/kernels``: create one -> 201 its model;
- ``GET /hub/api/gpuhub/kernels``: the member's kernels (a server token: that server's);
- ``GET /hub/api/gpuhub/kernels/<id>``: one, with its place in line while it waits and,
  once it ended, why;
- ``DELETE /hub/api/gpuhub/kernels/<id>``: 204, it leaves the line or its server stops.

All need the custom scope ``custom:gpuhub:kernels`` (:data:`KERNELS_SCOPE`); filtered
``!user=<name>`` (what members and their servers' tokens hold) a request sees and makes
that member's kernels only, and another member's kernel is 404.  A server's own token
(``JUPYTERHUB_API_TOKEN`` in the member's server) manages only the kernels it started
(their ``parent``); the member's own token or browser acts on all of hers.  Errors are
JSON ``{"status", "message"}`` in plain words; a refused request starts and charges
nothing.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.utils import url_escape_path, url_path_join
from tornado import web

from ..common.member_api import allowed_users, json_body, own_member, reply
from ..common.runs import JOB_PREFIX, KERNEL_PREFIX
from ..jobs.handlers import place_message
from ..jobs.lifecycle import the_line
from ..spawn.profiles import Selection, kernels_allowed, profile_overrides
from . import lifecycle, store
from .checks import KernelRefused

__all__ = ["KERNELS_SCOPE", "display_name", "handlers", "model"]

KERNELS_SCOPE = "custom:gpuhub:kernels"
#: a profile's name that says its GPUs already: "PyTorch, 1 GPU", "Two A100 GPUs"
SAYS_GPUS = re.compile(
    r"\b(\d+|an?|one|two|three|four|five|six|seven|eight)\s+(\S+\s+)?GPUs?\b", re.IGNORECASE
)


def display_name(name: str, gpus: str, price: float) -> str:
    """A GPU kernel as JupyterLab lists it: "Python 3 (PyTorch, 1 GPU, 1.00 credits/h)"
    (``name`` the profile's display name, ``gpus`` its GPUs in words, ``price`` credits per
    hour); the GPUs are left out when the name says them already (the shipped profile
    "PyTorch, 1 GPU" is not followed by "1 GPU" again)."""
    parts = [name] if SAYS_GPUS.search(name) else [name, gpus]
    return f"Python 3 ({', '.join(parts)}, {price:.2f} credits/h)"


#: the largest request body accepted (bytes): four paths and a slug
MAX_BODY_BYTES = 16 * 1024
KERNEL_ID = r"[0-9a-f]{12}"


def model(row: store.KernelRow, base_url: str, place: dict | None = None) -> dict:
    """A kernel as the API answers it (docs: reference/kernels-api); ``base_url``:
    JupyterHub's (``/``), under which the members' servers are."""
    state = row.state
    if state == "waiting" and place is None:
        state = "starting"
    return {
        "id": row.id,
        "profile": row.profile,
        "notebook": row.notebook,
        "parent": row.parent,
        "state": state,
        "place": place if row.state == "waiting" else None,
        "started": lifecycle.iso(row.started),
        "ended": {"reason": row.reason, "message": row.message} if row.state == "ended" else None,
        "server_url": url_path_join(
            base_url, "user", quote(row.user, safe=""), url_escape_path(row.server_name), "/"
        ),
        "gpus": list(row.gpus or []),
    }


class KernelsBase(APIHandler):
    """What the endpoints share: the scope and its filter, the requesting server, the row."""

    def allowed_users(self) -> set[str] | None:
        """The members whose kernels this request may see and act on: None for all.
        Raises 403 without the scope (:func:`hub_ext.common.member_scope.allowed_users`)."""
        return allowed_users(self, KERNELS_SCOPE, "GPU kernels")

    def member(self):
        """The member a new one is made for: the request's own user."""
        return own_member(
            self, KERNELS_SCOPE, "GPU kernels", "Only a member's own server starts her GPU kernels."
        )

    def requesting_server(self) -> str | None:
        """The name of the member's server whose own token this request carries ("" the
        default server), or None for her own token or her browser.  A server's token is
        the one JupyterHub made for it (``spawner.api_token``, or after a hub restart the
        token's note "Server at <its URL>", as JupyterHub's ``User.spawn`` writes it)."""
        token = self.get_auth_token() or self.get_argument("token", None)
        orm_token = orm.APIToken.find(self.db, token) if token else None
        if orm_token is None or orm_token.user is None:
            return None
        user = self.users[orm_token.user]
        for name in list(user.orm_spawners):
            spawner = user.spawners[name]
            if spawner.api_token and spawner.api_token == token:
                return name
            base = url_path_join(user.base_url, url_escape_path(name), "/")
            if orm_token.note == f"Server at {base}":
                return name
        return None

    def visible(self, row: store.KernelRow, allowed: set[str] | None, server: str | None) -> bool:
        if allowed is not None and row.user not in allowed:
            return False
        return server is None or (row.user == self.current_user.name and row.parent == server)

    def row_or_404(self, kernel_id: str) -> store.KernelRow:
        row = store.get(self.db, kernel_id)
        if row is None or not self.visible(row, self.allowed_users(), self.requesting_server()):
            raise web.HTTPError(404, f"No GPU kernel {kernel_id}.")
        return row

    def body(self):
        return json_body(
            self,
            MAX_BODY_BYTES,
            "a GPU kernel's request",
            '{"profile", "notebook", "cwd", "connection_dir"}',
        )

    def place(self, row: store.KernelRow) -> dict | None:
        """A waiting kernel's place: ``position`` (1: next; None while it waits behind the
        member's other kernel of its profile), ``estimate_s`` (seconds or None) and
        ``message`` ("Waiting for a GPU: 2nd in line, about 5 min"); None when it is not
        in line (its start was granted: it is starting)."""
        line = the_line(self.db)
        key = next(
            (p.key for p in line.ordered() if tuple(p.key) == (row.user, row.server_name)), None
        )
        if key is None:
            user = self.owner(row)
            if user is not None and lifecycle.held_back(user, row, line):
                return {
                    "position": None,
                    "estimate_s": None,
                    "message": "Waiting for a GPU: it starts after your other GPU kernel of "
                    "the same profile has its GPU.",
                }
            return None
        described = line.describe(key)
        position, estimate_s = described["position"], described["estimate_s"]
        return {
            "position": position,
            "estimate_s": estimate_s,
            "message": place_message(position, described["sentence"], estimate_s),
        }

    def owner(self, row):
        orm_user = orm.User.find(self.db, row.user)
        return self.users[orm_user] if orm_user is not None else None

    def answer(self, row: store.KernelRow) -> dict:
        place = self.place(row) if row.state == "waiting" else None
        return model(row, self.base_url, place)

    def reply(self, status: int, payload=None) -> None:
        reply(self, status, payload)

    @property
    def kernels(self) -> lifecycle.Kernels:
        return lifecycle.kernels_of(self.settings)


class KernelsAPIHandler(KernelsBase):
    """``GET|POST /hub/api/gpuhub/kernels``."""

    async def get(self):
        allowed = self.allowed_users()
        self.kernels  # noqa: B018 - the keeper runs once a request came
        server = self.requesting_server()
        who = None if allowed is None and server is None else self.current_user.name
        rows = [r for r in store.load(self.db, who) if self.visible(r, allowed, server)]
        self.reply(200, {"kernels": [self.answer(r) for r in rows]})

    async def post(self):
        user = self.member()
        body = self.body()
        server = self.requesting_server()
        if server is not None and server.startswith((KERNEL_PREFIX, JOB_PREFIX)):
            raise web.HTTPError(403, "A GPU kernel or a notebook job starts no GPU kernels.")
        if server is None:  # her own token: the body names her server
            server = body.get("parent", "") if isinstance(body, dict) else ""
            if not isinstance(server, str) or server.startswith((KERNEL_PREFIX, JOB_PREFIX)):
                raise web.HTTPError(400, 'parent must name one of your servers ("": the default).')
        if server not in user.orm_spawners or not user.spawners[server].ready:
            where = f"server {server!r}" if server else "default server"
            raise web.HTTPError(
                409, f"Your {where} is not running: a GPU kernel runs for a running server."
            )
        try:
            row = await lifecycle.create(self.kernels, user, body, server)
        except KernelRefused as e:
            self.log.info("GPU kernel of %s refused (%s): %s", user.name, e.status, e.message)
            raise web.HTTPError(e.status, e.message) from None
        self.set_header("Location", f"{self.hub.base_url}api/gpuhub/kernels/{row.id}")
        self.reply(201, self.answer(row))


class KernelAPIHandler(KernelsBase):
    """``GET|DELETE /hub/api/gpuhub/kernels/<id>``."""

    async def get(self, kernel_id: str):
        """The model; with ``?check=1`` (the member's server found the kernel's side gone)
        the kernel's server is polled first, and ended now if its container is gone, so
        the answer says why at once."""
        row = self.row_or_404(kernel_id)
        if self.get_argument("check", "") == "1" and row.state == "running":
            user = self.owner(row)
            spawner = lifecycle.spawner_of(user, row.server_name)
            if spawner is not None and spawner.ready and await spawner.poll() is not None:
                await lifecycle.stop_kernel_server(user, row.server_name)
                row = store.get(self.db, kernel_id) or row
        self.reply(200, self.answer(row))

    async def delete(self, kernel_id: str):
        row = self.row_or_404(kernel_id)
        user = self.owner(row)
        if user is None:
            raise web.HTTPError(404, f"No GPU kernel {kernel_id}.")
        who = self.current_user.name
        if who == row.user:
            reason, message = "shutdown", lifecycle.WORDS["shutdown"]
        else:
            reason, message = "stopped", f"The GPU kernel was stopped by {who}."
        await lifecycle.stop(user, row, reason, message)
        self.log.info("%s stopped GPU kernel %s of %s", who, kernel_id, row.user)
        self.reply(204)


class KernelSpecsAPIHandler(KernelsBase):
    """``GET /hub/api/gpuhub/kernels/specs``: the profiles that offer GPU kernels to the
    member, as her server lists them beside "Python 3"; none on a backend that runs no GPU
    kernels (the start would be refused with 501)."""

    async def get(self):
        user = self.member()
        spawner = user.spawner
        visible, _ = await spawner.get_profiles()
        offered = [p for p in visible if kernels_allowed(p)] if spawner.runs_gpu_kernels else []
        snapshot = await spawner.gpu_snapshot() if offered else None
        specs = []
        for profile in offered:
            overrides = profile_overrides(Selection(profile))
            gpus = spawner.gpus_now(snapshot, overrides)
            price = float(overrides.get("credits_per_hour", 0) or 0)
            unit = f"{gpus.kind} GPU slice" if gpus.mig else "GPU"
            specs.append(
                {
                    "name": f"gpuhub-{profile['slug']}",
                    "profile": profile["slug"],
                    "display_name": display_name(
                        profile.get("display_name", profile["slug"]),
                        f"{gpus.count} {unit}{'s' if gpus.count != 1 else ''}",
                        price,
                    ),
                    "image": str(overrides.get("image") or spawner.image),
                    "gpus": gpus.count,
                    "credits_per_hour": price,
                    "free_now": gpus.free,
                    "total": gpus.total,
                    "simulated": gpus.simulated,
                    "why_not": await self.why_not(spawner, price, gpus),
                }
            )
        self.reply(200, specs)

    async def why_not(self, spawner, price: float, gpus) -> str:
        """Why a kernel of that price and those GPUs cannot start for this member now,
        not even after a wait in line (the hooks' sentence: the credits; GPUs the backend
        does not have), or ""."""
        if gpus.refusal and not gpus.can_wait:
            return gpus.refusal
        for hook in spawner.hooks:
            words = await hook.why_not(spawner, price)
            if words:
                return words
        return ""


handlers = [
    (r"/api/gpuhub/kernels", KernelsAPIHandler),
    (r"/api/gpuhub/kernels/specs", KernelSpecsAPIHandler),
    (rf"/api/gpuhub/kernels/({KERNEL_ID})", KernelAPIHandler),
]
