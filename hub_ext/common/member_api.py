"""What the REST endpoints of the members' own things (notebook jobs, GPU kernels) share.

Whom a request may act for, from its custom scope (JupyterHub RBAC,
``handler.parsed_scopes``): everyone with the scope unfiltered (the GPU admins,
``gpuhub-cli``), the members named by its ``!user=`` filters otherwise (a member and her
servers' tokens: herself); the scopes are given by
:func:`hub_ext.common.services.grant_member_scope`.  Bodies are read by :func:`json_body`
(a size limit, then JSON); answers are written by :func:`reply`.
"""

from __future__ import annotations

import json

from jupyterhub.scopes import Scope
from tornado import web

from .json_body import parse_json

__all__ = ["allowed_users", "json_body", "own_member", "reply"]


def allowed_users(handler, scope: str, what: str) -> set[str] | None:
    """The members whose things (``what``: "notebook jobs") ``handler``'s request may see
    and act on: None for all, else the names of its ``!user=`` filters.  Raises
    ``HTTPError(403)`` without credentials or without ``scope``."""
    if handler.current_user is None:
        raise web.HTTPError(403, "Missing or invalid credentials.")
    sub = handler.parsed_scopes.get(scope)
    if sub is None:
        handler.log.warning("%s may not use %s (needs %s)", handler.current_user.name, what, scope)
        raise web.HTTPError(403, f"This token may not use {what}.")
    if sub == Scope.ALL:
        return None
    return set(sub.get("user", ()))


def own_member(handler, scope: str, what: str, refusal: str):
    """The request's own user, for whom a new thing is made: a member (not a service)
    within the scope's filter.  Raises ``HTTPError(403)`` with ``refusal`` otherwise."""
    who = handler.current_user
    allowed = allowed_users(handler, scope, what)
    if getattr(who, "kind", "user") != "user" or (allowed is not None and who.name not in allowed):
        raise web.HTTPError(403, refusal)
    return who


def json_body(handler, max_bytes: int, what: str, shape: str):
    """The request's body as JSON.  Raises ``HTTPError(413)`` over ``max_bytes`` ("a job
    takes at most ...": ``what`` is "a job"), ``HTTPError(400)`` for anything that is not
    JSON, naming the ``shape`` to send."""
    size = len(handler.request.body)
    if size > max_bytes:
        raise web.HTTPError(413, f"The body is {size} bytes; {what} takes at most {max_bytes}.")
    try:
        return parse_json(handler.request.body or b"null")
    except ValueError:
        raise web.HTTPError(400, f"The body is not JSON: send {shape}.") from None


def reply(handler, status: int, payload=None) -> None:
    """Answer now, ``payload`` as JSON (None: no body); the request is finished, so what
    the handler does after it does not keep the caller waiting."""
    handler.set_status(status)
    if payload is None:
        handler.finish()
        return
    handler.set_header("Content-Type", "application/json")
    handler.set_header("Cache-Control", "no-store")
    handler.finish(json.dumps(payload))
