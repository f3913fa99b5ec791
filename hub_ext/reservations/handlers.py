"""The reservations' REST endpoints and admin page (``c.JupyterHub.extra_handlers``).

- ``GET /hub/api/gpuhub/reservations``: ``{"reservations": [...]}``, each with its
  ``next`` occurrence (``{"start", "end"}`` or null); with ``?from=&to=`` (ISO 8601, at
  most :data:`MAX_WINDOW_DAYS` apart) also ``"occurrences"`` in that window, in order;
- ``POST /hub/api/gpuhub/reservations``: create one (JSON: ``group``, ``gpus``, ``start``,
  ``end``; optional ``mig_profile``, ``timezone``, ``rrule``, ``exdates``, ``note``);
  201 with the reservation and a ``Location`` header;
- ``GET|PATCH|DELETE /hub/api/gpuhub/reservations/<id>``: one; PATCH takes the fields to
  change, and the result is checked whole again; DELETE answers 204;
- ``GET /hub/reservations``: the page (template ``reservations.html``), whose form and
  Delete buttons call the endpoints above (with the ``_xsrf`` token, as the GPU board's
  Stop does); an instructor reads there what their course may reserve.

All need the custom scope ``custom:gpuhub:reservations:admin`` (:mod:`.hubconfig` gives it
to the admin groups and to the ``gpuhub-cli`` token).  JupyterHub accepts ``!group=``
filters on custom scopes, so a role holding
``custom:gpuhub:reservations:admin!group=ml101`` manages ML101's reservations only: another
group's reservation is 404 to it, creating one for another group (or moving one there) 403.
Such a caller (a course's instructor, :mod:`hub_ext.courses.hubconfig`) is also held to the
course's bounds (:mod:`.bounds`: no sooner than the warning time, so many GPUs, hours per
occurrence and days ahead; 403 beyond them), and a 409 names no reservation of a group it
does not manage.  Admins (the scope unfiltered) are not bound.

Errors are JSON ``{"status", "message"}`` with the reason in words, and nothing is stored:
400 for a body that is not a JSON object, a field unknown or of the wrong type, a group that
does not exist, an end not after its start, a recurrence that cannot be read or never occurs,
more GPUs than the hub has; 403 beyond an instructor's bounds; 409 when overlapping
reservations would need more GPUs than the hub has (the other reservations, the time and
the numbers named to whoever may see them), or when the backend
refuses it (Slurm's words, :mod:`.backend`); 413 for a body over :data:`MAX_BODY_BYTES`; 503
when the backend cannot count its GPUs or does not answer.  A creation's check and write run
with no ``await`` between them, so two requests to the one hub process cannot both pass the
capacity check against the same free GPUs; the backend is told after the write (the row is
deleted again when it refuses) and, for an edit or a deletion, before it.

On Slurm the backend makes each reservation Slurm's own (:mod:`hub_ext.slurm.reservations`).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import Scope
from sqlalchemy import select
from tornado import web

from ..common.clock import utcnow
from ..common.json_body import parse_json
from . import store
from .backend import BackendRefused, BackendUnavailable
from .bounds import OutOfBounds, ReservationBounds, check_bounds
from .capacity import CapacityUnknown, hub_capacity
from .enforce import Reservations
from .rules import Conflict, Invalid, check_capacity, occurrences, parse_spec, parse_time, validate

__all__ = ["RESERVATIONS_SCOPE", "handlers", "managed_groups", "utcnow"]

RESERVATIONS_SCOPE = "custom:gpuhub:reservations:admin"
#: the largest request body accepted
MAX_BODY_BYTES = 16 * 1024
#: the widest ?from=&to= window
MAX_WINDOW_DAYS = 400


def managed_groups(handler) -> set[str] | None:
    """The groups whose reservations the request may manage: None for every group (the
    scope unfiltered), else the groups of its ``!group=`` filters (a ``!user=`` filter
    names no group: none).  Raises 403 without the scope."""
    sub = handler.parsed_scopes.get(RESERVATIONS_SCOPE)
    if sub is None:
        who = getattr(handler.current_user, "name", "?")
        handler.log.warning("%s may not manage reservations (needs %s)", who, RESERVATIONS_SCOPE)
        raise web.HTTPError(
            403, "Only admins (and a course's instructors) may manage reservations."
        )
    if sub == Scope.ALL:
        return None
    return set(sub.get("group", ()))


def next_occurrence(spec, now: datetime) -> dict | None:
    """The occurrence running now or next, as ``{"start", "end"}``; None when none is left."""
    for o in occurrences(spec, since=now):
        return {"start": store.iso(o.start), "end": store.iso(o.end)}
    return None


def model(row, now: datetime, base_url: str) -> dict:
    """A row as the API shows it, with its ``next`` occurrence and its ``url``."""
    return {
        **store.to_model(row),
        "next": next_occurrence(store.to_spec(row), now),
        "url": f"{base_url}api/gpuhub/reservations/{row.id}",
    }


class ReservationBase(APIHandler):
    """What the endpoints share: the scope, the body, the checks."""

    def groups_allowed(self) -> set[str] | None:
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        return managed_groups(self)

    def body(self) -> dict:
        if len(self.request.body) > MAX_BODY_BYTES:
            raise web.HTTPError(
                413,
                f"The body is {len(self.request.body)} bytes; a "
                f"reservation takes at most {MAX_BODY_BYTES}.",
            )
        try:
            body = parse_json(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(
                400,
                "The body is not JSON: send a JSON object such as "
                '{"group": "ml101", "gpus": 1, "start": ..., '
                '"end": ...}.',
            ) from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "The body must be a JSON object.")
        return body

    def row_or_404(self, reservation_id: str, allowed: set[str] | None):
        row = store.get(self.db, int(reservation_id))
        if row is None or (allowed is not None and row.group not in allowed):
            raise web.HTTPError(404, f"No reservation {reservation_id}.")
        return row

    async def checked(self, spec, allowed: set[str] | None, before=None):
        """``spec`` once it passed every rule; raises 400/403/409/503.  ``before``: the
        stored reservation an edit changes.  A caller whose scope is filtered to some
        groups (a course's instructor) is held to the course's bounds (:mod:`.bounds`),
        and reads the reservations of other groups in a 409 without their names.  Ends
        with no ``await`` pending, so the caller's write follows the check at once."""
        if allowed is not None and spec.group not in allowed:
            raise web.HTTPError(
                403,
                "You may manage the reservations of "
                f"{', '.join(sorted(allowed)) or 'no group'} only, "
                f"not of {spec.group!r}.",
            )
        try:
            capacity = await hub_capacity(self, spec.mig_profile)
        except CapacityUnknown as e:
            raise web.HTTPError(
                503, f"The hub cannot count its GPUs now ({e}); try again later."
            ) from None
        now = utcnow()
        groups = self.db.scalars(select(orm.Group.name)).all()
        specs = store.all_specs(self.db)
        try:
            validate(spec, now, groups, capacity)
            if allowed is not None:
                check_bounds(
                    spec,
                    before,
                    [s for s in specs if s.group == spec.group],
                    self.bounds(spec.group),
                    capacity,
                    now,
                    self.warning(),
                )
            check_capacity(spec, specs, capacity, now)
        except Conflict as e:
            self.log.info("reservation for %s refused: %s", spec.group, e)
            raise web.HTTPError(409, e.told_to(allowed)) from None
        except OutOfBounds as e:
            who = self.current_user.name
            self.log.info("reservation for %s by %s refused: %s", spec.group, who, e)
            raise web.HTTPError(403, str(e)) from None
        except Invalid as e:
            raise web.HTTPError(400, str(e)) from None
        return now

    def bounds(self, group: str):
        """The bounds of ``group``'s course (``c.ReservationBounds``)."""
        return ReservationBounds(config=self.settings["config"], log=self.log).of(group)

    def warning(self) -> float:
        """``c.Reservations.warning``: an instructor's reservation starts no sooner."""
        return Reservations.instance(config=self.settings["config"]).warning

    async def tell_backend(self, spec, reservation_id: int) -> None:
        """The backend's part (Slurm makes its own reservation): raises 409 with its words
        when it refuses, 503 when it does not answer."""
        backend = self.settings["spawner_class"]
        try:
            await backend.reservation_changed(self, spec, reservation_id)
        except BackendRefused as e:
            self.log.info("reservation %s refused by the backend: %s", reservation_id, e)
            raise web.HTTPError(409, str(e)) from None
        except BackendUnavailable as e:
            self.log.warning("reservation %s: the backend does not answer: %s", reservation_id, e)
            raise web.HTTPError(
                503, f"The cluster does not answer ({e}); nothing was changed. Try again later."
            ) from None

    def parse(self, body: dict, base=None):
        try:
            return parse_spec(body, base)
        except Invalid as e:
            raise web.HTTPError(400, str(e)) from None

    def reply(self, status: int, payload: dict | None) -> None:
        self.set_status(status)
        if payload is not None:
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.finish(json.dumps(payload))


class ReservationsAPIHandler(ReservationBase):
    """``GET|POST /hub/api/gpuhub/reservations``."""

    async def get(self):
        allowed = self.groups_allowed()
        now = utcnow()
        rows = store.load(self.db, allowed)
        payload = {"reservations": [model(r, now, self.hub.base_url) for r in rows]}
        since, until = self.get_argument("from", None), self.get_argument("to", None)
        if since is not None or until is not None:
            payload["occurrences"] = self.window(rows, since, until)
        self.reply(200, payload)

    def window(self, rows, since: str | None, until: str | None) -> list[dict]:
        try:
            start = parse_time(since, "from") if since else utcnow()
            end = parse_time(until, "to") if until else start + timedelta(days=7)
        except Invalid as e:
            raise web.HTTPError(400, str(e)) from None
        if not start < end <= start + timedelta(days=MAX_WINDOW_DAYS):
            raise web.HTTPError(
                400, f"to must be after from, at most {MAX_WINDOW_DAYS} days later."
            )
        found = []
        for row in rows:
            spec = store.to_spec(row)
            found += [
                {
                    "reservation": row.id,
                    "group": row.group,
                    "gpus": row.gpus,
                    "mig_profile": row.mig_profile,
                    "start": o.start,
                    "end": o.end,
                }
                for o in occurrences(spec, since=start, until=end)
            ]
        found.sort(key=lambda o: (o["start"], o["reservation"]))
        return [{**o, "start": store.iso(o["start"]), "end": store.iso(o["end"])} for o in found]

    async def post(self):
        allowed = self.groups_allowed()
        spec = self.parse(self.body())
        now = await self.checked(spec, allowed)
        row = store.insert(self.db, spec, self.current_user.name, now)
        try:
            await self.tell_backend(spec, row.id)
        except BaseException:
            store.delete(self.db, row)  # refused, or Slurm not answering: nothing kept
            raise
        self.log.info(
            "%s reserved %d %s for group %s from %s (rule %s): reservation %d",
            self.current_user.name,
            spec.gpus,
            spec.units,
            spec.group,
            store.iso(spec.start),
            spec.rrule,
            row.id,
        )
        self.set_header("Location", f"{self.hub.base_url}api/gpuhub/reservations/{row.id}")
        self.reply(201, model(row, now, self.hub.base_url))


class ReservationAPIHandler(ReservationBase):
    """``GET|PATCH|DELETE /hub/api/gpuhub/reservations/<id>``."""

    async def get(self, reservation_id: str):
        row = self.row_or_404(reservation_id, self.groups_allowed())
        self.reply(200, model(row, utcnow(), self.hub.base_url))

    async def patch(self, reservation_id: str):
        allowed = self.groups_allowed()
        row = self.row_or_404(reservation_id, allowed)
        before = store.to_spec(row)
        spec = self.parse(self.body(), before)
        now = await self.checked(spec, allowed, before)
        row = self.row_or_404(reservation_id, allowed)  # deleted while we counted GPUs?
        await self.tell_backend(spec, row.id)
        row = self.row_or_404(reservation_id, allowed)
        store.update(self.db, row, spec)
        self.log.info("%s changed reservation %d of %s", self.current_user.name, row.id, row.group)
        self.reply(200, model(row, now, self.hub.base_url))

    async def delete(self, reservation_id: str):
        row = self.row_or_404(reservation_id, self.groups_allowed())
        await self.tell_backend(None, row.id)
        store.delete(self.db, row)
        self.log.info(
            "%s deleted reservation %s of %s", self.current_user.name, reservation_id, row.group
        )
        self.reply(204, None)


class ReservationsPageHandler(BaseHandler):
    """``/hub/reservations``: the admin page."""

    @web.authenticated
    async def get(self):
        allowed = managed_groups(self)
        now = utcnow()
        rows = [model(r, now, self.hub.base_url) for r in store.load(self.db, allowed)]
        groups = sorted(
            g
            for g in self.db.scalars(select(orm.Group.name)).all()
            if allowed is None or g in allowed
        )
        html = await self.render_template(
            "reservations.html",
            reservations=rows,
            groups=groups,
            bounds=await self.bounds_of(groups) if allowed is not None else [],
            api_url=self.hub.base_url + "api/gpuhub/reservations",
        )
        self.finish(html)

    async def bounds_of(self, groups: list[str]) -> list[str]:
        """What an instructor may reserve for each of ``groups``, in words (none when the
        hub cannot count its GPUs now)."""
        try:
            capacity = await hub_capacity(self)
        except CapacityUnknown:
            return []
        config = self.settings["config"]
        warning = Reservations.instance(config=config).warning
        bounds = ReservationBounds(config=config, log=self.log)
        return [bounds.of(group).summary(capacity, warning) for group in groups]


handlers = [
    (r"/reservations", ReservationsPageHandler),
    (r"/api/gpuhub/reservations", ReservationsAPIHandler),
    (r"/api/gpuhub/reservations/([0-9]{1,18})", ReservationAPIHandler),
]
