"""The hub's client for the Credits API: balances, debits, refunds, grants and the ledger.

The contract is ``hub_ext/credits/openapi.yaml`` (a copy of the organisation's
``credits-api.yaml``); this module follows it exactly and refuses answers that do not:

- Amounts are credits, held as :class:`decimal.Decimal` and sent as decimal strings with
  two places ("1.50"); floats, and amounts moved that are not greater than zero (contract
  1.1, ``PositiveAmount``), are refused before anything is sent.
- Usernames, ``reason``, ``metadata`` and ``debit_id`` are checked against the contract's
  limits (:mod:`hub_ext.credits.contract`) before anything is sent: ValueError.
- Every write carries the caller's ``Idempotency-Key``.  The hub derives keys from the
  server and the metering interval, so a retry of the same write can never take credits
  twice: the service answers a replay with the original transaction (status 200).
- Connection errors, timeouts and 5xx answers are retried with exponential back-off and
  jitter, with the *same* key; when the attempts run out the call raises
  :class:`~hub_ext.credits.errors.CreditsUnavailable`.
- Other refusals raise the typed errors of :mod:`hub_ext.credits.errors`.

The API token is sent only in the ``Authorization`` header.  It never appears in a log
line, in ``repr()`` or in an exception message (any quoted server text is scrubbed).

Tests inject an :class:`httpx.MockTransport` through the ``transport`` argument::

    client = CreditsClient(url="http://credits.test", token="t", transport=MockTransport(f))
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping
from decimal import Decimal
from typing import Any

import httpx
from traitlets import Any as AnyTrait
from traitlets import Float, Integer, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ..settings import value
from .contract import MAX_ID
from .errors import (
    AccountNotFound,
    CreditsAuthError,
    CreditsContractError,
    CreditsError,
    CreditsUnavailable,
    DebitNotFound,
    IdempotencyConflict,
    InsufficientCredits,
    InvalidCreditsRequest,
    RefundExceedsDebit,
)
from .wire import (
    Account,
    Transaction,
    account_path,
    answer_amount,
    checked_key,
    parse_account,
    parse_transaction,
    retry_after_seconds,
    write_body,
)

__all__ = ["Account", "CreditsClient", "Transaction"]

# Statuses each operation documents (openapi.yaml); anything else below 500 is a contract error.
_DOCUMENTED = {
    "balance": {200, 401, 404},
    "debit": {200, 201, 400, 401, 402, 404, 409, 422},
    "refund": {200, 201, 400, 401, 404, 409, 422},
    "grant": {200, 201, 401, 403, 409, 422},
    "transactions": {200, 400, 401, 404},
}


class CreditsClient(LoggingConfigurable):
    """Async client of the Credits API (``hub_ext/credits/openapi.yaml``).

    All public methods are coroutines.  Each raises
    :class:`~hub_ext.credits.errors.CreditsUnavailable` when the service cannot be reached
    after ``max_attempts`` tries, :class:`~hub_ext.credits.errors.CreditsAuthError` on 401/403
    and :class:`~hub_ext.credits.errors.CreditsContractError` on an answer the contract does
    not allow; the method docstrings list the rest.  Close with :meth:`aclose` or use
    ``async with``.
    """

    url = Unicode(
        help="""Base URL of the Credits API, without the /v1 part.

        c.CreditsClient.url = "http://127.0.0.1:8123"

        Defaults to the GPUHUB_CREDITS_URL environment variable.
        """,
    ).tag(config=True)

    token = Unicode(
        help="""API token sent as `Authorization: Bearer <token>`; never logged.

        c.CreditsClient.token = os.environ["GPUHUB_CREDITS_TOKEN"]

        Defaults to the GPUHUB_CREDITS_TOKEN environment variable.
        """,
    ).tag(config=True)

    timeout = Float(
        10.0,
        help="""Seconds to wait for one answer (connect, read, write, each).

        c.CreditsClient.timeout = 10.0
        """,
    ).tag(config=True)

    max_attempts = Integer(
        4,
        help="""Tries per call, counting the first; connection errors, timeouts and 5xx are
        retried with the same Idempotency-Key.

        c.CreditsClient.max_attempts = 4
        """,
    ).tag(config=True)

    backoff_base = Float(
        0.25,
        help="""Seconds of the first back-off; each retry doubles it, with full jitter.

        c.CreditsClient.backoff_base = 0.25
        """,
    ).tag(config=True)

    backoff_max = Float(
        5.0,
        help="""Longest back-off in seconds, also the cap on a server's Retry-After.

        c.CreditsClient.backoff_max = 5.0
        """,
    ).tag(config=True)

    transport = AnyTrait(
        None,
        allow_none=True,
        help="An httpx async transport to use instead of the network (tests: httpx.MockTransport).",
    )

    @default("log")
    def _log_default(self) -> logging.Logger:
        parent_log = getattr(self.parent, "log", None)
        return parent_log if parent_log is not None else logging.getLogger(__name__)

    @default("url")
    def _url_default(self) -> str:
        return value("GPUHUB_CREDITS_URL")

    @default("token")
    def _token_default(self) -> str:
        return value("GPUHUB_CREDITS_TOKEN")

    @validate("url")
    def _validate_url(self, proposal: dict) -> str:
        value = proposal["value"].strip()
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(
                "c.CreditsClient.url must start with http:// or https://, "
                f"e.g. 'http://127.0.0.1:8123', not {value!r}"
            )
        return value.rstrip("/") + "/" if value else value

    @validate("max_attempts")
    def _validate_max_attempts(self, proposal: dict) -> int:
        if proposal["value"] < 1:
            raise ValueError("c.CreditsClient.max_attempts must be at least 1 (the first try)")
        return proposal["value"]

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._http: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} url={self.url!r}>"

    async def __aenter__(self) -> CreditsClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool; the client may not be used afterwards."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- the operations ---------------------------------------------------------------

    async def balance(self, username: str) -> Account:
        """The account of ``username`` and its balance in credits.

        Raises :class:`AccountNotFound` when the user has no account (never granted).
        """
        response = await self._request("GET", account_path(username), label=f"balance {username}")
        data = self._check("balance", response, username)
        return parse_account(data, username)

    async def debit(
        self,
        username: str,
        amount: Decimal | int | str,
        *,
        key: str,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Transaction:
        """Take ``amount`` credits from ``username``'s account.

        ``key`` is the Idempotency-Key (8 to 255 characters): the same key with the same
        arguments returns the original transaction (``replayed=True``) and takes nothing
        more.  Raises :class:`InsufficientCredits` (nothing was taken; ``.balance`` says what
        is there), :class:`AccountNotFound`, :class:`IdempotencyConflict` (the key was used
        with other arguments) or :class:`InvalidCreditsRequest`.
        """
        body = write_body(amount, reason=reason, metadata=metadata)
        response = await self._request(
            "POST",
            account_path(username, "debits"),
            label=f"debit {username} {body['amount']} key={checked_key(key)}",
            body=body,
            key=key,
        )
        data = self._check("debit", response, username)
        return parse_transaction(data, username, kind="debit", replayed=response.status_code == 200)

    async def refund(
        self,
        username: str,
        debit_id: str,
        amount: Decimal | int | str,
        *,
        key: str,
        reason: str | None = None,
    ) -> Transaction:
        """Give back ``amount`` credits of the debit ``debit_id`` to ``username``.

        Several partial refunds of one debit are allowed up to the debit's amount.  Raises
        :class:`RefundExceedsDebit` (more than what is left of the debit),
        :class:`DebitNotFound` (404: ``debit_id`` is not a debit of this account),
        :class:`AccountNotFound`, :class:`IdempotencyConflict` or
        :class:`InvalidCreditsRequest`; ValueError for a ``debit_id`` not 1 to 255 characters.
        """
        body = write_body(amount, reason=reason)
        if not isinstance(debit_id, str) or not 1 <= len(debit_id) <= MAX_ID:
            raise ValueError(f"debit_id must be a transaction id of 1 to {MAX_ID} characters")
        body["debit_id"] = debit_id
        response = await self._request(
            "POST",
            account_path(username, "refunds"),
            label=f"refund {username} {body['amount']} of {debit_id} key={checked_key(key)}",
            body=body,
            key=key,
        )
        data = self._check("refund", response, username)
        return parse_transaction(
            data, username, kind="refund", replayed=response.status_code == 200
        )

    async def grant(
        self,
        username: str,
        amount: Decimal | int | str,
        *,
        key: str,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Transaction:
        """Add ``amount`` credits to ``username``'s account, creating it if needed.

        Needs an admin token: raises :class:`CreditsAuthError` (403) with a hub token.  Also
        raises :class:`IdempotencyConflict` or :class:`InvalidCreditsRequest`.
        """
        body = write_body(amount, reason=reason, metadata=metadata)
        response = await self._request(
            "POST",
            account_path(username, "grants"),
            label=f"grant {username} {body['amount']} key={checked_key(key)}",
            body=body,
            key=key,
        )
        data = self._check("grant", response, username)
        return parse_transaction(data, username, kind="grant", replayed=response.status_code == 200)

    async def transactions(
        self, username: str, limit: int = 50, before: str | None = None
    ) -> tuple[list[Transaction], str | None]:
        """One page of ``username``'s ledger, newest first, and the ``before`` of the next page.

        ``limit`` is 1 to 500.  ``before`` is a transaction id: only older entries are
        listed.  The second item is ``None`` on the last page.  Raises
        :class:`AccountNotFound`, or :class:`InvalidCreditsRequest` for an unknown ``before``.
        """
        if not 1 <= limit <= 500:
            raise ValueError(f"limit must be between 1 and 500, got {limit}")
        params: dict[str, str | int] = {"limit": limit}
        if before is not None:
            params["before"] = before
        response = await self._request(
            "GET",
            account_path(username, "transactions"),
            label=f"transactions {username}",
            params=params,
        )
        data = self._check("transactions", response, username)
        entries = data.get("transactions")
        if not isinstance(entries, list):
            raise CreditsContractError("transactions answer without a `transactions` list")
        page = [parse_transaction(entry, username) for entry in entries]
        next_before = data.get("next_before")
        if next_before is not None and not isinstance(next_before, str):
            raise CreditsContractError("transactions answer with a non-string `next_before`")
        return page, next_before

    async def iter_transactions(
        self, username: str, page_size: int = 100
    ) -> AsyncIterator[Transaction]:
        """Every entry of ``username``'s ledger, newest first, fetched a page at a time."""
        before: str | None = None
        while True:
            page, before = await self.transactions(username, limit=page_size, before=before)
            for entry in page:
                yield entry
            if before is None:
                return

    # -- HTTP ---------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            if not self.url:
                raise CreditsError(
                    "No Credits API URL: set c.CreditsClient.url or GPUHUB_CREDITS_URL"
                )
            self._http = httpx.AsyncClient(
                base_url=self.url,
                timeout=httpx.Timeout(self.timeout),
                transport=self.transport,
                follow_redirects=False,
            )
        return self._http

    def _scrub(self, text: str) -> str:
        """``text`` with the token replaced, for messages that quote what a server said."""
        if self.token and self.token in text:
            text = text.replace(self.token, "[token]")
        return text

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max)
        return random.uniform(0, min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1)))

    async def _request(
        self,
        method: str,
        path: str,
        *,
        label: str,
        body: dict | None = None,
        params: dict | None = None,
        key: str | None = None,
    ) -> httpx.Response:
        """Send one API call, retrying transient failures; the same headers every try.

        ``body`` goes as ASCII JSON (``\\u`` escapes), not httpx's ``json=`` (UTF-8), which
        cannot encode a reason holding a lone surrogate: valid in a JSON string, so the
        contract's to send."""
        client = self._client()
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            content = json.dumps(body, ensure_ascii=True).encode("ascii")
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if key is not None:
            headers["Idempotency-Key"] = key
        problem = ""
        for attempt in range(1, self.max_attempts + 1):
            retry_after: float | None = None
            try:
                response = await client.request(
                    method, path, content=content, params=params, headers=headers
                )
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                problem = f"{type(exc).__name__}: {self._scrub(str(exc)) or 'no detail'}"
            except httpx.HTTPError as exc:
                raise CreditsUnavailable(
                    f"Credits API {label}: {type(exc).__name__}: {self._scrub(str(exc))}"
                ) from None
            else:
                if response.status_code < 500:
                    self.log.debug("Credits API %s: %s", label, response.status_code)
                    return response
                problem = f"HTTP {response.status_code}"
                retry_after = retry_after_seconds(response)
            if attempt == self.max_attempts:
                break
            delay = self._backoff(attempt, retry_after)
            self.log.warning(
                "Credits API %s failed (%s); retry %d of %d in %.2fs",
                label,
                problem,
                attempt,
                self.max_attempts - 1,
                delay,
            )
            await asyncio.sleep(delay)
        self.log.error(
            "Credits API %s failed %d times, last: %s", label, self.max_attempts, problem
        )
        raise CreditsUnavailable(
            f"Credits API {label} failed after {self.max_attempts} attempts; last: {problem}"
        )

    def _check(self, operation: str, response: httpx.Response, username: str) -> dict:
        """The JSON object of a 2xx answer, or the typed error for any other."""
        status = response.status_code
        if status not in _DOCUMENTED[operation]:
            raise CreditsContractError(
                f"Credits API {operation}: status {status} is not in the contract", status=status
            )
        data = self._json(response, operation)
        if status < 300:
            return data
        code, message = data.get("error"), data.get("message")
        if not isinstance(code, str) or not isinstance(message, str):
            raise CreditsContractError(
                f"Credits API {operation}: {status} answer without `error` and `message`",
                status=status,
            )
        text = (
            f"Credits API {operation} for {username!r} refused ({status} {code}): "
            + self._scrub(message)
        )
        if status == 402:
            balance = data.get("balance")
            raise InsufficientCredits(
                text,
                balance=None if balance is None else answer_amount(balance, "balance"),
                code=code,
            )
        if status in (401, 403):
            raise CreditsAuthError(text, status=status, code=code)
        if status == 404 and code == "account_not_found":
            raise AccountNotFound(text, username=username, code=code)
        if status == 404 and operation == "refund" and code == "debit_not_found":
            raise DebitNotFound(text, status=status, code=code)
        if status == 409:
            raise IdempotencyConflict(text, status=status, code=code)
        if status == 422 and code == "refund_exceeds_debit":
            raise RefundExceedsDebit(text, status=status, code=code)
        raise InvalidCreditsRequest(text, status=status, code=code)

    def _json(self, response: httpx.Response, operation: str) -> dict:
        content_type = response.headers.get("Content-Type", "")
        if content_type.split(";")[0].strip().lower() != "application/json":
            raise CreditsContractError(
                f"Credits API {operation}: answer is {content_type or 'untyped'}, not JSON",
                status=response.status_code,
            )
        try:
            data = json.loads(response.content)
        except (ValueError, UnicodeDecodeError):
            raise CreditsContractError(
                f"Credits API {operation}: answer is not valid JSON", status=response.status_code
            ) from None
        if not isinstance(data, dict):
            raise CreditsContractError(
                f"Credits API {operation}: answer is not a JSON object", status=response.status_code
            )
        return data
