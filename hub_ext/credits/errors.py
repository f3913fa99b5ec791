"""Typed errors of the credits client, one per way a Credits API call can end badly.

Every error derives from :class:`CreditsError`, so the hub can refuse a spawn on any of
them.  The mapping from HTTP answers follows ``hub_ext/credits/openapi.yaml``:

==============================  ===============================================
answer                          error
==============================  ===============================================
402                             :class:`InsufficientCredits` (with ``balance``)
404 ``account_not_found``       :class:`AccountNotFound`
409                             :class:`IdempotencyConflict`
401, 403                        :class:`CreditsAuthError`
422 ``refund_exceeds_debit``    :class:`RefundExceedsDebit`
404 ``debit_not_found``         :class:`DebitNotFound` (a refund; contract 1.1)
other 400, 404, 422             :class:`InvalidCreditsRequest`
no answer, timeout, 5xx         :class:`CreditsUnavailable` (after retries)
anything the contract excludes  :class:`CreditsContractError`
==============================  ===============================================

Messages never contain the API token: the client scrubs it from any text it quotes.
"""

from __future__ import annotations

from decimal import Decimal

__all__ = [
    "AccountNotFound",
    "CreditsAuthError",
    "CreditsContractError",
    "CreditsError",
    "CreditsUnavailable",
    "DebitNotFound",
    "IdempotencyConflict",
    "InsufficientCredits",
    "InvalidCreditsRequest",
    "RefundExceedsDebit",
]


class CreditsError(Exception):
    """Base of every credits error.

    ``status`` is the HTTP status of the answer (``None`` when there was none) and
    ``code`` the contract's machine-readable ``error`` field, when the service sent one.
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class CreditsUnavailable(CreditsError):
    """The Credits API could not be reached, timed out or answered 5xx, after all retries."""


class CreditsContractError(CreditsError):
    """An answer that does not match the contract: not JSON, a missing field, a bad amount,
    or a status code the operation does not document."""


class CreditsAuthError(CreditsError):
    """401 (no token or a wrong one) or 403 (a hub token used for an admin-only grant)."""


class AccountNotFound(CreditsError):
    """404 ``account_not_found``: the user has no credits account (no grant yet)."""

    def __init__(
        self,
        message: str,
        *,
        username: str,
        status: int | None = 404,
        code: str | None = "account_not_found",
    ):
        super().__init__(message, status=status, code=code)
        self.username = username


class InsufficientCredits(CreditsError):
    """402: the debit is larger than the balance; nothing was taken.

    ``balance`` is the account's balance in credits as the service reported it, or ``None``
    when the answer did not include one (the contract makes it optional).
    """

    def __init__(
        self,
        message: str,
        *,
        balance: Decimal | None,
        status: int | None = 402,
        code: str | None = "insufficient_credits",
    ):
        super().__init__(message, status=status, code=code)
        self.balance = balance


class IdempotencyConflict(CreditsError):
    """409: the Idempotency-Key was already used with a different request body."""


class InvalidCreditsRequest(CreditsError):
    """400, 422 or a 404 other than a missing account: the service refused the request as
    written (bad amount, unknown debit, unknown ``before`` transaction, ...)."""


class RefundExceedsDebit(InvalidCreditsRequest):
    """422 ``refund_exceeds_debit``: more than what is left of the debit to refund."""


class DebitNotFound(InvalidCreditsRequest):
    """404 ``debit_not_found``: the refund's ``debit_id`` names no debit of the account."""
