"""Credits: the hub's client of the Credits API and the reference service behind it.

- :mod:`hub_ext.credits.client` — :class:`CreditsClient`, used by the hub to debit and refund.
- :mod:`hub_ext.credits.account` — a member's account as the authenticator reads it at
  login (the balance in ``auth_state``, the initial grant made once).
- :mod:`hub_ext.credits.service` — the reference service (tornado + SQLAlchemy), for
  organisations without a credit system of their own.
- :mod:`hub_ext.credits.cli` — ``gpuhub credits grant|balance|history``.

The contract of both sides is ``hub_ext/credits/openapi.yaml``.
"""

from .client import Account, CreditsClient, Transaction
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

__all__ = [
    "Account",
    "AccountNotFound",
    "CreditsAuthError",
    "CreditsClient",
    "CreditsContractError",
    "CreditsError",
    "CreditsUnavailable",
    "DebitNotFound",
    "IdempotencyConflict",
    "InsufficientCredits",
    "InvalidCreditsRequest",
    "RefundExceedsDebit",
    "Transaction",
]
