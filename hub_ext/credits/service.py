"""The reference Credits API service: tornado in front of the ledger.

It implements ``hub_ext/credits/openapi.yaml`` for organisations without a credit system
of their own.  Run it with::

    GPUHUB_CREDITS_HUB_TOKEN=... GPUHUB_CREDITS_ADMIN_TOKEN=... \\
        python -m hub_ext.credits.service --ip 127.0.0.1 --port 8123 \\
        --db-url sqlite:////srv/gpuhub/credits.sqlite

It migrates the database to the newest revision at start-up (``--upgrade-only`` migrates
and exits, for deploys).  The database password may come from
``GPUHUB_CREDITS_DB_PASSWORD`` instead of the URL, so that no URL shown anywhere holds it.
Two tokens: the hub token may read, debit, refund and list; the admin token may also grant.
Requests without either get 401, a hub token on a grant 403.

Status codes follow the contract (version 1.1).  Where it leaves a choice:

- a request the service cannot read (body not JSON, Idempotency-Key missing or not 8 to
  255 characters) is 400 on debits and refunds and 422 on grants, whose contract has no 400;
- a body that is JSON but not a valid request (unknown field, an amount that is not a
  ``PositiveAmount``, a reason that is not a string or over 500 characters, metadata beyond
  its limits, a ``debit_id`` not 1 to 255 characters) is 422 ``invalid_request`` (a zero
  amount: ``invalid_amount``); the message names the rule that was broken;
- text the contract allows but a text column cannot hold (NUL, lone surrogates) in a
  reason or metadata is stored exactly (:mod:`hub_ext.credits.models`); in an id, a
  username or a ``before`` it names nothing: 404;
- a username that breaks the contract's rule (:mod:`hub_ext.credits.contract`) names no
  account: 404 ``account_not_found``, and on a grant 422 ``invalid_username``;
- a refund naming no debit of the account is 404 ``debit_not_found`` (the contract's rule);
- an unknown ``before`` in a listing is 404 ``transaction_not_found``; a ``limit`` outside
  1 to 500 is 400 (the contract's rule).

Behind JupyterHub's proxy the routes live under ``JUPYTERHUB_SERVICE_PREFIX``
(``--base-url``).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tornado import httpserver, netutil, web
from tornado.log import access_log, enable_pretty_logging

from ..common.dburl import with_password
from ..common.json_body import parse_json
from ..settings import value
from .amounts import AMOUNT_PATTERN, POSITIVE_AMOUNT_PATTERN, format_cents, to_cents
from .contract import MAX_ID, metadata_problem, reason_problem, username_problem
from .db import make_engine, upgrade
from .ledger import Ledger, LedgerError, WriteRequest
from .models import storable

__all__ = ["ServiceSettings", "build_parser", "main", "make_app"]

log = logging.getLogger("hub_ext.credits.service")

MAX_BODY_BYTES = 64 * 1024
_WRITE_FIELDS = {"amount", "reason", "metadata"}
_REFUND_FIELDS = {"amount", "debit_id", "reason"}


@dataclass
class ServiceSettings:
    """What the handlers share: the ledger, its worker threads and the two tokens."""

    ledger: Ledger
    executor: ThreadPoolExecutor
    hub_token: str
    admin_token: str | None = None


class APIError(web.HTTPError):
    """A refusal written as the contract's ``Error`` object."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(status, reason=None)
        self.code = code
        self.message = message


class BaseHandler(web.RequestHandler):
    """JSON answers, bearer-token authentication and ledger calls in worker threads."""

    settings_key = "credits"
    admin_only = False

    @property
    def credits(self) -> ServiceSettings:
        return self.settings[self.settings_key]

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    def check_xsrf_cookie(self) -> None:
        """Bearer tokens only; there are no cookies to forge."""

    def prepare(self) -> None:
        token = self._bearer_token()
        admin = self.credits.admin_token
        if token is not None and admin and hmac.compare_digest(token, admin):
            self.current_user = "admin"
        elif token is not None and hmac.compare_digest(token, self.credits.hub_token):
            self.current_user = "hub"
        else:
            self.set_header("WWW-Authenticate", 'Bearer realm="credits"')
            raise APIError(401, "unauthorized", "A valid API token is required (Bearer).")
        if self.admin_only and self.current_user != "admin":
            raise APIError(403, "forbidden", "Only an admin token may grant credits.")

    def _bearer_token(self) -> str | None:
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, APIError):
            body = {"error": exc.code, "message": exc.message}
        elif status_code == 405:
            self.set_header("Allow", ", ".join(self.SUPPORTED_METHODS))
            body = {"error": "method_not_allowed", "message": "Method not allowed here."}
        elif status_code >= 500:
            body = {"error": "internal_error", "message": "The credits service failed."}
        else:
            body = {"error": "bad_request", "message": self._reason}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def send(self, status: int, body: dict) -> None:
        self.set_status(status)
        self.finish(json.dumps(body))

    async def call(self, fn: Callable, *args: Any) -> Any:
        """Run a blocking ledger call in a worker thread; a LedgerError becomes its answer."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.credits.executor, fn, *args
            )
        except LedgerError as exc:
            self.set_status(exc.status)
            self.finish(json.dumps(exc.to_json()))
            return None

    def known_username(self, username: str) -> str:
        """A username that can exist; any other is 404 (grants refuse them with 422)."""
        if username_problem(username) or not storable(username):
            raise APIError(404, "account_not_found", f"No credits account for user {username!r}.")
        return username


class AccountHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    async def get(self, username: str) -> None:
        body = await self.call(self.credits.ledger.account, self.known_username(username))
        if body is not None:
            self.send(200, body)


class TransactionsHandler(BaseHandler):
    SUPPORTED_METHODS = ("GET",)

    async def get(self, username: str) -> None:
        raw_limit = self.get_query_argument("limit", "50")
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= 500 or not raw_limit.strip().isdigit():
            raise APIError(400, "invalid_request", "limit must be an integer from 1 to 500.")
        before = self.get_query_argument("before", None)
        if before is not None and (len(before) > MAX_ID or not storable(before)):
            raise APIError(404, "transaction_not_found", f"No transaction {before!r}.")
        body = await self.call(
            self.credits.ledger.transactions, self.known_username(username), limit, before
        )
        if body is not None:
            self.send(200, body)


class WriteHandler(BaseHandler):
    """POST of a debit, refund or grant: validation, then one ledger write."""

    SUPPORTED_METHODS = ("POST",)
    kind = ""
    fields = _WRITE_FIELDS
    required = frozenset({"amount"})
    unreadable_status = 400

    def write_request(self, username: str) -> WriteRequest:
        key = self.request.headers.get("Idempotency-Key")
        if key is None or not 8 <= len(key) <= 255:
            raise APIError(
                self.unreadable_status,
                "invalid_idempotency_key",
                "Every write needs an Idempotency-Key header of 8 to 255 characters.",
            )
        try:
            body = parse_json(self.request.body)
        except ValueError:  # bad syntax, not UTF-8, nested too deep
            raise APIError(
                self.unreadable_status, "invalid_json", "The request body is not JSON."
            ) from None
        if not isinstance(body, dict):
            raise APIError(422, "invalid_request", "The request body must be a JSON object.")
        unknown = sorted(set(body) - self.fields)
        if unknown:
            raise APIError(
                422,
                "invalid_request",
                f"Unknown field(s) {', '.join(map(repr, unknown))}; "
                f"fields are {', '.join(sorted(self.fields))}.",
            )
        missing = sorted(self.required - set(body))
        if missing:
            raise APIError(422, "invalid_request", f"Missing field(s): {', '.join(missing)}.")
        cents = _positive_cents(body["amount"])
        # optional fields may be left out, never sent as null (the schemas are not nullable)
        reason = body.get("reason")
        problem = reason_problem(reason) if "reason" in body else None
        if problem:
            raise APIError(422, "invalid_request", problem + ".")
        metadata = body.get("metadata")
        problem = metadata_problem(metadata) if "metadata" in body else None
        if problem:
            raise APIError(422, "invalid_request", problem + ".")
        debit_id = body.get("debit_id")
        if "debit_id" in self.fields:
            if not isinstance(debit_id, str) or not 1 <= len(debit_id) <= MAX_ID:
                raise APIError(
                    422,
                    "invalid_request",
                    f"debit_id must be a transaction id of 1 to {MAX_ID} characters.",
                )
            if not storable(debit_id):
                raise APIError(404, "debit_not_found", f"{debit_id!r} is not a debit.")
        return WriteRequest(
            username=username,
            key=key,
            amount_cents=cents,
            reason=reason,
            metadata=metadata,
            debit_id=debit_id,
        )

    async def post(self, username: str) -> None:
        if self.kind == "grant":
            problem = username_problem(username)
            if problem or not storable(username):
                raise APIError(422, "invalid_username", (problem or "a username is UTF-8") + ".")
        else:
            self.known_username(username)
        request = self.write_request(username)
        ledger = self.credits.ledger
        result = await self.call(getattr(ledger, self.kind), request)
        if result is None:
            log.info(
                "%s %s %s key=%s refused: %s",
                self.kind,
                username,
                format_cents(request.amount_cents),
                request.key,
                self._status_code,
            )
            return
        entry, replayed = result
        log.info(
            "%s %s %s key=%s -> %s balance %s%s",
            self.kind,
            username,
            entry["amount"],
            request.key,
            entry["transaction_id"],
            entry["balance"],
            " (replay)" if replayed else "",
        )
        self.send(200 if replayed else 201, entry)


class DebitHandler(WriteHandler):
    kind = "debit"


class RefundHandler(WriteHandler):
    kind = "refund"
    fields = _REFUND_FIELDS
    required = frozenset({"amount", "debit_id"})


class GrantHandler(WriteHandler):
    kind = "grant"
    admin_only = True
    unreadable_status = 422


class NotFoundHandler(BaseHandler):
    """Any other path: 404 in the contract's error shape, before authentication."""

    def prepare(self) -> None:
        raise APIError(404, "not_found", "No such endpoint.")


def _positive_cents(amount: object) -> int:
    """The hundredths of a ``PositiveAmount`` string; APIError 422 for anything else."""
    if isinstance(amount, str) and POSITIVE_AMOUNT_PATTERN.fullmatch(amount):
        return to_cents(amount)
    if isinstance(amount, str) and AMOUNT_PATTERN.fullmatch(amount) and to_cents(amount) == 0:
        raise APIError(422, "invalid_amount", "amount must be greater than zero.")
    raise APIError(
        422,
        "invalid_request",
        "amount must be a decimal string greater than zero, with at most two places and no "
        'leading zeros, like "1.50".',
    )


def make_app(settings: ServiceSettings, base_url: str = "/") -> web.Application:
    """The tornado application serving the contract's routes under ``base_url``."""
    prefix = "/" + base_url.strip("/")
    prefix = "" if prefix == "/" else prefix
    account = prefix + r"/v1/accounts/([^/]+)"
    return web.Application(
        [
            (account, AccountHandler),
            (account + "/debits", DebitHandler),
            (account + "/refunds", RefundHandler),
            (account + "/grants", GrantHandler),
            (account + "/transactions", TransactionsHandler),
        ],
        default_handler_class=NotFoundHandler,
        credits=settings,
        log_function=_log_request,
    )


def _log_request(handler: web.RequestHandler) -> None:
    """Access log without query strings; nothing of the Authorization header."""
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    access_log.log(
        level,
        "%d %s %s %.1fms",
        status,
        handler.request.method,
        handler.request.path,
        1000 * handler.request.request_time(),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hub_ext.credits.service",
        description="The reference Credits API service (hub_ext/credits/openapi.yaml).",
    )
    service_url = urlsplit(os.environ.get("JUPYTERHUB_SERVICE_URL", ""))
    parser.add_argument(
        "--ip",
        default=service_url.hostname or "127.0.0.1",
        help="address to listen on (default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=service_url.port or 8123,
        help="port to listen on; 0 picks a free one (default 8123)",
    )
    parser.add_argument(
        "--db-url",
        default=value("GPUHUB_CREDITS_DB_URL") or "sqlite:///credits.sqlite",
        help="SQLAlchemy URL: sqlite:///path or postgresql+psycopg://user@host/db "
        "(default GPUHUB_CREDITS_DB_URL; the password from GPUHUB_CREDITS_DB_PASSWORD)",
    )
    parser.add_argument(
        "--base-url",
        default=os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"),
        help="path prefix of every route (default JUPYTERHUB_SERVICE_PREFIX or /)",
    )
    parser.add_argument(
        "--hub-token",
        default=value("GPUHUB_CREDITS_HUB_TOKEN") or None,
        help="token for reads, debits and refunds "
        "(prefer GPUHUB_CREDITS_HUB_TOKEN: flags show in ps)",
    )
    parser.add_argument(
        "--admin-token",
        default=value("GPUHUB_CREDITS_ADMIN_TOKEN") or None,
        help="token that may also grant (prefer GPUHUB_CREDITS_ADMIN_TOKEN)",
    )
    parser.add_argument(
        "--db-threads", type=int, default=8, help="worker threads for database calls (default 8)"
    )
    parser.add_argument(
        "--upgrade-only",
        action="store_true",
        help="migrate the database to the newest revision and exit",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser


async def serve(args: argparse.Namespace, ledger: Ledger) -> None:
    """Listen until SIGTERM or SIGINT, then close the server and the worker threads."""
    executor = ThreadPoolExecutor(max_workers=args.db_threads, thread_name_prefix="ledger")
    settings = ServiceSettings(
        ledger=ledger, executor=executor, hub_token=args.hub_token, admin_token=args.admin_token
    )
    app = make_app(settings, args.base_url)
    sockets = netutil.bind_sockets(args.port, address=args.ip)
    server = httpserver.HTTPServer(app, max_body_size=MAX_BODY_BYTES, xheaders=True)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    host = f"[{args.ip}]" if ":" in args.ip else args.ip
    prefix = "/" + args.base_url.strip("/")
    log.info("Credits service listening on http://%s:%d%s", host, port, prefix)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("Credits service stopping")
    server.stop()
    await server.close_all_connections()
    executor.shutdown(wait=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hub_ext.credits.service``; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.getLogger().setLevel(args.log_level.upper())
    enable_pretty_logging()
    if not args.upgrade_only:
        if not args.hub_token:
            log.error("No hub token: set GPUHUB_CREDITS_HUB_TOKEN (or --hub-token)")
            return 2
        if args.admin_token and hmac.compare_digest(args.admin_token, args.hub_token):
            log.error("The admin token must differ from the hub token")
            return 2
        if not args.admin_token:
            log.warning("No admin token (GPUHUB_CREDITS_ADMIN_TOKEN): grants are refused")
    try:
        db_url = with_password(
            args.db_url, value("GPUHUB_CREDITS_DB_PASSWORD"), "GPUHUB_CREDITS_DB_PASSWORD"
        )
    except ValueError as e:
        log.error("%s", e)
        return 2
    engine = make_engine(db_url, pool_size=max(args.db_threads, 1))
    try:
        upgrade(engine)
        log.info(
            "Database %s at the newest revision", engine.url.render_as_string(hide_password=True)
        )
        if args.upgrade_only:
            return 0
        asyncio.run(serve(args, Ledger(engine)))
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
