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
start servers, runs inside the spawner's ``checked_spawn(options)``
(:meth:`hub_ext.spawn.core.SpawnerCore.checked_spawn`; the Docker backend checks its
GPUs, the Slurm backend admits every start to ``start()``) for a server that is neither
running nor pending: its check first, then JupyterHub's code unchanged.  A refusal is the
``HTTPError`` that ``start()`` would raise, with the same status and words, so the API's
JSON and the spawn form's message read as before.  The check is advisory: ``start()``
checks again and the GPU pool's reservation stays the one authority over who holds a GPU.

Where the gate sits: JupyterHub routes a request to the first of its handlers whose
pattern matches (tornado ``Application``), and ``JupyterHub.init_handlers`` (``app.py``)
lists the authenticator's own handlers (``Authenticator.get_handlers``, documented for
login handlers) before its default handlers, while ``c.JupyterHub.extra_handlers`` come
after them and could never answer a route JupyterHub already has.  So the hub's
authenticator (:class:`hub_ext.login.authenticator.CreditAuthenticator`) mixes in
:class:`GatedRoutes`,
which adds the two handler subclasses below for JupyterHub's own spawn routes (their
patterns read from JupyterHub's ``default_handlers``, so they cannot drift apart).

The early answer (:class:`EarlyRefusal`, on the REST API's start only): under a rush the
refusal itself is cheap and what remains is JupyterHub's handling of each request before
``post()`` runs, ``BaseHandler.prepare`` (the login cookie's user, loaded with its eager
relations, refreshed, its scopes resolved, the XSRF token checked) and then
``post()``'s own ``find_user``, the same user loaded again: about 7 ms of the hub's
event loop per request (py-spy), which 200 requests at once queue behind.  For the one
case decided without that work (see :meth:`EarlyRefusal.early_refusal`: a member's own
browser session starting their own default server, which the spawner refuses now), the
handler finds the member among the users loaded in the hub (an index of their
``cookie_id``), runs JupyterHub's own remaining steps (activity, scopes, XSRF) and
answers the refusal from ``prepare()``: tornado hands it to
``write_error`` as it would an error from ``post()``, so the status and JSON are
JupyterHub's.  Every other request (tokens, services, admins acting for others, named
servers, a login due for refresh, a server already starting or running, a start the
spawner admits) goes through JupyterHub's ``prepare()`` and ``post()`` unchanged.  The
spawn form (``POST /hub/spawn``) keeps JupyterHub's handling: its refusal is the form page
rendered again around the message, which needs that page's own work anyway.
"""

from __future__ import annotations

import time

from jupyterhub.apihandlers import users as api_users
from jupyterhub.handlers import pages
from jupyterhub.scopes import has_scope
from sqlalchemy.exc import SQLAlchemyError
from tornado import web

from .stopping import StopAfterCancelledStart

#: the hub's settings key of its :class:`CookieIndex`
COOKIE_INDEX = "gpuhub_cookie_index"


class CookieIndex:
    """``ids``: ``{cookie_id: user id}`` of the users loaded in the hub when it was built,
    ``built_from`` of them (see ``EarlyRefusal._user_id_for``)."""

    def __init__(self):
        self.ids: dict[str, int] = {}
        self.built_from = -1


async def refusal(spawner, options: dict | None) -> web.HTTPError | None:
    """The refusal ``spawner`` gives now to a start with ``user_options`` ``options``
    (its ``check_spawn``: the same check ``checked_spawn`` makes), or None when it would
    admit it or has no such check.  Advisory: nothing is reserved; a claim the check
    leaves counts only while the start is handed over or pending (``check_gpus_now``)."""
    try:
        await spawner.check_spawn(options)
    except web.HTTPError as e:
        return e
    return None


class SpawnGate:
    """Mixed into a JupyterHub handler: ``spawn_single_user`` runs inside the spawner's
    ``checked_spawn(options)``, which refuses first what the spawner knows it would refuse
    (``tornado.web.HTTPError``)."""

    async def spawn_single_user(self, user, server_name="", display_name="", options=None):
        spawner = user.get_or_create_spawner(server_name, display_name, replace_failed=True)
        if spawner.active:
            return await super().spawn_single_user(user, server_name, display_name, options=options)
        async with spawner.checked_spawn(options):
            return await super().spawn_single_user(user, server_name, display_name, options=options)


class EarlyRefusal:
    """Mixed into JupyterHub's ``UserServerAPIHandler``: ``prepare()`` answers a start the
    spawner refuses now before JupyterHub's own request handling (see the module doc)."""

    async def prepare(self):
        try:
            refused = await self.early_refusal()
        except Exception as e:  # noqa: BLE001 - JupyterHub's own handling meets it again
            self.log.exception("The early refusal failed; JupyterHub handles the request")
            if isinstance(e, SQLAlchemyError):
                self.db.rollback()  # as BaseHandler.prepare does after such an error
            refused = None
        if refused is None:
            await super().prepare()
            return
        # tornado's _execute hands an error from prepare() to write_error as it does one
        # from post(): APIHandler's JSON {"status", "message"}, the request logged as before
        self.log.debug(
            "Refused %s's start before JupyterHub's request handling", self.current_user.name
        )
        raise refused

    async def early_refusal(self) -> web.HTTPError | None:
        """The spawner's refusal of this request's start, or None: JupyterHub handles the
        request from the start, nothing of this attempt kept (see :meth:`_session_user`).

        Decided here only for the member found by :meth:`_session_user`, starting their own
        default server: JupyterHub's own steps of ``BaseHandler.prepare`` run for that
        member (the activity record: any cookie-authenticated request is the member's
        activity, written at most every ``c.JupyterHub.activity_resolution`` seconds; the
        roles' scopes; the XSRF check), then ``post()``'s own ``get_or_create_spawner``.
        A failed XSRF check, no ``start:servers`` on this server, a body that ``post()``
        refuses or that names a display name, a server starting or running, and a start
        the spawner admits all leave the request to JupyterHub.
        """
        if self.request.method != "POST" or self.path_args[1:2] not in ([], [""]):
            return None
        user = self._session_user()
        if user is None:
            return None
        self._jupyterhub_user = user
        refused = None
        try:
            if self._record_activity(user):
                self.db.commit()
            self._resolve_roles_and_scopes()
            try:
                self.check_xsrf_cookie()
                body = self.get_server_json_body()
            except web.HTTPError:
                return None
            if body.get("display_name") or not has_scope(
                f"start:servers!server={user.name}/", self.parsed_scopes, db=self.db
            ):
                return None
            spawner = user.get_or_create_spawner("", "", replace_failed=True)
            if not spawner.active:
                refused = await refusal(spawner, body["user_options"])
            return refused
        finally:
            if refused is None:
                del self._jupyterhub_user  # JupyterHub's prepare() identifies anew

    def _session_user(self):
        """The hub's ``User`` this request's login cookie belongs to, when it is decided
        without JupyterHub's ORM work, else None.

        That is: no API token (JupyterHub tries a token first); a JSON body or none (as
        ``APIHandler.get_current_user_cookie`` requires of a POST); a session cookie; the
        login cookie verified as JupyterHub verifies it (``get_secure_cookie``: tornado's
        signature, ``cookie_max_age_days``); its ``cookie_id`` that of a user loaded in the
        hub now (``self.users``; :meth:`_user_id_for`), as ``BaseHandler._user_for_cookie``
        finds it in the database (a deleted user has neither; JupyterHub's logout clears
        the browser's cookies and keeps ``cookie_id``, so a replayed cookie of a
        logged-out member is that member's here as in JupyterHub's own handlers); that
        user the URL's own,
        and its login not due for a refresh (``c.Authenticator.auth_refresh_age``, as
        ``BaseHandler.refresh_auth`` decides).
        """
        if self.get_auth_token() or not self.settings.get("xsrf_cookies"):
            return None
        if not self.check_post_content_type() or not self.get_session_cookie():
            return None
        cookie_id = self.get_secure_cookie(
            self.hub.cookie_name, max_age_days=self.cookie_max_age_days
        )
        if cookie_id is None:
            return None
        cookie_id = cookie_id.decode("utf8", "replace")
        user = dict.get(self.users, self._user_id_for(cookie_id))
        if user is None or user.cookie_id != cookie_id:
            self.settings[COOKIE_INDEX].ids.pop(cookie_id, None)
            return None
        if user.name != self.path_args[0]:
            return None
        age = self.authenticator.auth_refresh_age
        if age and not (user._auth_refreshed and time.monotonic() - user._auth_refreshed < age):
            return None
        return user

    def _user_id_for(self, cookie_id: str) -> int | None:
        """The id of the loaded user (``self.users``) whose ``cookie_id`` this is, or None.

        Read from an index of the loaded users' ``cookie_id``, rebuilt when the number of
        loaded users changed since it was built: ``cookie_id`` is written once, when
        JupyterHub creates the user (``orm.User.cookie_id``'s default), and JupyterHub
        never changes it.  The caller checks a hit against the users loaded now
        (JupyterHub deletes a user through ``UserDict.delete``, which drops it) and their
        ``cookie_id``, and forgets an entry that fails.  Why not a query: on PostgreSQL
        under a rush each one is a round trip that blocks the hub's event loop (psycopg is
        synchronous), plus JupyterHub's ``SELECT 1`` ping when the session checks out a
        connection: about 7 ms a request on this machine (py-spy), 1.4 s for 200.
        """
        index = self.settings.setdefault(COOKIE_INDEX, CookieIndex())
        if cookie_id not in index.ids and index.built_from != len(self.users):
            index.ids = {user.cookie_id: user_id for user_id, user in list(dict.items(self.users))}
            index.built_from = len(self.users)
        return index.ids.get(cookie_id)


class GatedServerAPIHandler(
    EarlyRefusal, SpawnGate, StopAfterCancelledStart, api_users.UserServerAPIHandler
):
    """JupyterHub's ``/hub/api/users/:name/server[s/:server]``: ``POST`` gated (and refused
    early), ``DELETE`` of a starting server answered once its start has cleaned up
    (:class:`hub_ext.spawn.stopping.StopAfterCancelledStart`)."""


class GatedSpawnHandler(SpawnGate, pages.SpawnHandler):
    """JupyterHub's ``/hub/spawn[/:user[/:server]]`` (the spawn form), gated."""


def gated_routes() -> list[tuple[str, type]]:
    """``(pattern, handler)`` for JupyterHub's spawn routes, with the gated handlers; the
    patterns are JupyterHub's own (``default_handlers`` of its API and page handlers),
    without the hub prefix (JupyterHub adds it to an authenticator's handlers)."""
    gated = {
        api_users.UserServerAPIHandler: GatedServerAPIHandler,
        pages.SpawnHandler: GatedSpawnHandler,
    }
    return [
        (route[0], gated[route[1]])
        for route in [*api_users.default_handlers, *pages.default_handlers]
        if route[1] in gated
    ]


class GatedRoutes:
    """Mixed into the hub's authenticator: its handlers, and the gated spawn routes ahead
    of JupyterHub's own (see the module doc)."""

    def get_handlers(self, app):
        return [*super().get_handlers(app), *gated_routes()]
