"""``POST /hub/api/gpuhub/courses/<slug>/grants``: an instructor grants course credits.

Body ``{"user": "alice", "amount": "5.00", "reason": "lab 3", "request_id": "..."}``:
``amount`` in credits (a decimal string with at most two places, or a whole number),
``reason`` optional, ``request_id`` optional (8 to 100 characters; one is made when
missing).  The credits move from the course's account to the member: a debit of the course
account (the hub's token), then a grant to the member (the Credits API's admin token), each
with an ``Idempotency-Key`` made from the course and the request id, so sending the same
request again (after a timeout, a 503) moves the credits once.  201 with ``request_id``,
the two transaction ids, the course account's balance and ``replayed`` (true when nothing
new was moved).

Needs ``custom:gpuhub:courses:grant`` (:mod:`.hubconfig`; filtered ``!group=<course
group>`` for a course's instructors).  Nobody grants a course's credits to themselves
(an instructor who is also a student of the course; admins too) unless the course's
``self_grants`` is true (``GPUHUB_COURSES``).  Answers, JSON ``{"status", "message"}``:
403 without the scope, or for a grant to oneself; 404 for a course that does not exist
or is not the caller's (the same words, so another course's name is not confirmed), and for
a user who is not a member of the course; 400 for a malformed body or a course without
an account; 402 when the course account cannot pay (nothing moved); 409 for a request id
reused with other arguments; 503 when the Credits API does not answer or the hub has no
admin token (send again with the same ``request_id``).
"""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import Scope
from tornado import web
from traitlets import Dict, Unicode
from traitlets.config import LoggingConfigurable

from ..common.json_body import parse_json
from ..credits.client import CreditsClient
from ..credits.errors import (
    AccountNotFound,
    CreditsError,
    CreditsUnavailable,
    IdempotencyConflict,
    InsufficientCredits,
)
from .hubconfig import GRANT_SCOPE

__all__ = ["CourseGrants", "handlers"]

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{8,100}")
MAX_BODY_BYTES = 4096


class CourseGrants(LoggingConfigurable):
    """What the grant endpoint reads from the hub's configuration."""

    courses = Dict(
        help="""The courses, by slug: {"group", "account", "display_name",
        "self_grants"}; set from GPUHUB_COURSES by apply_courses_config.

        c.CourseGrants.courses = {"ml101": {"group": "ml101", "account": "course-ml101",
                                            "display_name": "ML101", "self_grants": False}}
        """
    ).tag(config=True)

    admin_token = Unicode(
        help="""The Credits API's admin token, for the grant to the member
        (the debit of the course account uses the hub's own token, c.CreditsClient.token).
        Empty: grants are refused with 503.

        c.CourseGrants.admin_token = open(".../credits-admin-token").read().strip()
        """
    ).tag(config=True)


class CourseGrantHandler(APIHandler):
    """Move credits from a course's account to one of its members."""

    async def post(self, slug: str):
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        who = self.current_user.name
        sub = self.parsed_scopes.get(GRANT_SCOPE)
        if sub is None:
            self.log.warning("%s may not grant course credits (needs %s)", who, GRANT_SCOPE)
            raise web.HTTPError(403, "Only a course's instructors may grant course credits.")
        config = CourseGrants(config=self.settings["config"], log=self.log)
        course = config.courses.get(slug)
        if course is None or (sub != Scope.ALL and course["group"] not in sub.get("group", ())):
            raise web.HTTPError(404, f"No course {slug!r}.")
        body = self._body()
        user, amount, reason, request_id = self._fields(body)
        member = orm.User.find(self.db, user)
        if member is None or course["group"] not in {g.name for g in member.groups}:
            raise web.HTTPError(404, f"{user} is not a member of {course['display_name']}.")
        if member.name == who and not course.get("self_grants"):
            self.log.warning("%s may not grant %s's credits to themselves", who, slug)
            raise web.HTTPError(
                403,
                f"You may not grant {course['display_name']}'s credits to yourself: "
                "another instructor or an admin may. (A course allows it with "
                "self_grants in GPUHUB_COURSES.)",
            )
        account = course["account"]
        if not account:
            raise web.HTTPError(
                400,
                f"{course['display_name']} has no credit account "
                f"(GPUHUB_COURSES: course {slug!r}, field account).",
            )
        if not config.admin_token:
            raise web.HTTPError(
                503,
                "This hub cannot grant credits: it has no admin token of "
                "the Credits API (GPUHUB_CREDITS_ADMIN_TOKEN).",
            )
        metadata = {"course": slug, "member": user, "by": who, "request": request_id}
        reason = reason or f"course credits of {course['display_name']} from {who}"
        key = f"course-grant:{slug}:{request_id}"
        hub_client = CreditsClient(config=self.settings["config"], log=self.log)
        admin_client = CreditsClient(
            config=self.settings["config"], log=self.log, token=config.admin_token
        )
        try:
            debit = await hub_client.debit(
                account, amount, key=key + ":debit", reason=reason, metadata=metadata
            )
            grant = await admin_client.grant(
                user, amount, key=key + ":grant", reason=reason, metadata=metadata
            )
        except InsufficientCredits as e:
            have = f"{e.balance:.2f} credits" if e.balance is not None else "too few credits"
            raise web.HTTPError(
                402,
                f"{course['display_name']}'s account has {have}; it "
                f"cannot pay {amount} credits. Nothing was moved.",
            ) from None
        except AccountNotFound:
            raise web.HTTPError(
                402,
                f"{course['display_name']}'s account {account} has no "
                "credits yet (an admin grants them first). Nothing was "
                "moved.",
            ) from None
        except IdempotencyConflict:
            raise web.HTTPError(
                409, f"request_id {request_id!r} was used for another grant; send a new one."
            ) from None
        except CreditsUnavailable:
            self.log.warning("course grant %s: Credits API unavailable", key)
            raise web.HTTPError(
                503,
                "The credits service does not answer. Send the same "
                f"request again with request_id {request_id!r}: it "
                "moves the credits once.",
            ) from None
        except CreditsError as e:
            self.log.error("course grant %s failed: %s", key, e)
            raise web.HTTPError(502, "The credits service refused the grant.") from None
        finally:
            await hub_client.aclose()
            await admin_client.aclose()
        self.log.info(
            "%s granted %s credits of course %s (%s) to %s, request %s%s",
            who,
            amount,
            slug,
            account,
            user,
            request_id,
            " (replayed)" if debit.replayed and grant.replayed else "",
        )
        self.set_status(201)
        self.set_header("Content-Type", "application/json")
        self.write(
            json.dumps(
                {
                    "course": slug,
                    "user": user,
                    "amount": f"{Decimal(amount):.2f}",
                    "request_id": request_id,
                    "debit": debit.transaction_id,
                    "grant": grant.transaction_id,
                    "course_balance": f"{debit.balance:.2f}",
                    "replayed": debit.replayed and grant.replayed,
                }
            )
        )

    def _body(self) -> dict:
        if len(self.request.body) > MAX_BODY_BYTES:
            raise web.HTTPError(413, f"A grant is at most {MAX_BODY_BYTES} bytes.")
        try:
            body = parse_json(self.request.body or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise web.HTTPError(
                400,
                'The body must be a JSON object such as {"user": '
                '"alice", "amount": "5.00", "reason": "lab 3"}.',
            )
        unknown = sorted(set(body) - {"user", "amount", "reason", "request_id"})
        if unknown:
            raise web.HTTPError(
                400,
                f"Unknown field {unknown[0]!r}; fields are user, amount, reason and request_id.",
            )
        return body

    def _fields(self, body: dict) -> tuple[str, str, str | None, str]:
        from ..credits.amounts import format_amount

        user = body.get("user")
        if not isinstance(user, str) or not user:
            raise web.HTTPError(400, "user: the member's name is required.")
        amount = body.get("amount")
        try:
            if isinstance(amount, bool) or not isinstance(amount, str | int):
                raise TypeError
            amount = format_amount(amount)
            if Decimal(amount) <= 0:
                raise ValueError
        except (TypeError, ValueError, ArithmeticError):
            raise web.HTTPError(
                400, 'amount: credits greater than zero, as "5.00" or 5 (at most two places).'
            ) from None
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 300):
            raise web.HTTPError(400, "reason: a text of at most 300 characters.")
        request_id = body.get("request_id") or uuid.uuid4().hex
        if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
            raise web.HTTPError(400, "request_id: 8 to 100 letters, digits or . _ : -")
        return user, amount, reason, request_id


handlers = [(r"/api/gpuhub/courses/([^/]+)/grants", CourseGrantHandler)]
