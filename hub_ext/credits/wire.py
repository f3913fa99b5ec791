"""The Credits API's messages: what the client sends and what it accepts back.

Requests: an account's path, the Idempotency-Key and a write's JSON body, each checked
against the contract (``hub_ext/credits/openapi.yaml``, limits in
:mod:`hub_ext.credits.contract`) before anything is sent; ValueError or TypeError names
what is wrong.  Answers: :class:`Account` and :class:`Transaction` parsed from the
service's JSON, refusing with :class:`~hub_ext.credits.errors.CreditsContractError`
anything the contract does not allow (amounts as decimal strings in credits, RFC 3339
date-times with an offset, the account asked about).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import httpx

from .amounts import format_amount, parse_amount, to_cents
from .contract import metadata_problem, reason_problem, username_problem
from .errors import CreditsContractError

__all__ = [
    "Account",
    "Transaction",
    "account_path",
    "answer_amount",
    "checked_key",
    "parse_account",
    "parse_transaction",
    "retry_after_seconds",
    "write_body",
]

TRANSACTION_KINDS = frozenset({"debit", "refund", "grant"})


@dataclass(frozen=True, slots=True)
class Account:
    """One credits account (schema ``Account``): ``balance`` in credits."""

    username: str
    balance: Decimal
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Transaction:
    """One ledger entry (schema ``Transaction``).

    ``amount`` and ``balance`` (the balance after this transaction) are in credits.
    ``replayed`` is true when the service answered 200: the write had already been made
    with the same Idempotency-Key and this is the original result.
    """

    transaction_id: str
    kind: str
    username: str
    amount: Decimal
    balance: Decimal
    created_at: datetime
    reason: str | None = None
    debit_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    replayed: bool = False


# -- helpers: requests ---------------------------------------------------------------------


def account_path(username: str, operation: str | None = None) -> str:
    problem = username_problem(username)
    if problem:
        raise ValueError(f"username {str(username)[:40]!r} breaks the contract: {problem}")
    path = "v1/accounts/" + quote(username, safe="")
    return f"{path}/{operation}" if operation else path


def checked_key(key: str) -> str:
    if not isinstance(key, str) or not 8 <= len(key) <= 255:
        raise ValueError("Idempotency-Key must be a string of 8 to 255 characters")
    return key


def write_body(
    amount: Decimal | int | str,
    *,
    reason: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON body of a write; raises ValueError (TypeError for wrong types) for what the
    contract refuses: an amount not greater than zero, a reason over 500 characters,
    metadata beyond 20 entries or with values over 500 characters."""
    if to_cents(amount) == 0:
        raise ValueError("an amount moved must be greater than zero (contract: PositiveAmount)")
    body: dict[str, Any] = {"amount": format_amount(amount)}
    if reason is not None:
        problem = reason_problem(reason)
        if problem:
            raise ValueError(problem)
        body["reason"] = reason
    if metadata is not None:
        metadata = dict(metadata)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata keys and values must be strings")
        problem = metadata_problem(metadata)
        if problem:
            raise ValueError(problem)
        body["metadata"] = metadata
    return body


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` header in seconds; None when absent or not a number."""
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# -- helpers: answers ----------------------------------------------------------------------


def answer_amount(value: object, name: str) -> Decimal:
    """An amount in an answer (credits, a decimal string) as a Decimal; raises
    CreditsContractError naming the field when it is not a contract amount."""
    try:
        return parse_amount(value)
    except ValueError:
        raise CreditsContractError(f"`{name}` is not a contract amount: {value!r}") from None


def _string(data: dict, name: str, *, required: bool = True) -> str | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise CreditsContractError(f"`{name}` missing or not a string")
    return value


def _timestamp(data: dict, name: str, *, required: bool = True) -> datetime | None:
    value = _string(data, name, required=required)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise CreditsContractError(f"`{name}` is not an RFC 3339 date-time: {value!r}") from None
    if parsed.tzinfo is None:
        raise CreditsContractError(f"`{name}` has no UTC offset: {value!r}")
    return parsed


def parse_account(data: dict, username: str) -> Account:
    name = _string(data, "username")
    if name != username:
        raise CreditsContractError(f"asked for account {username!r}, got {name!r}")
    return Account(
        username=name,
        balance=answer_amount(data.get("balance"), "balance"),
        updated_at=_timestamp(data, "updated_at", required=False),
    )


def parse_transaction(
    data: object, username: str, *, kind: str | None = None, replayed: bool = False
) -> Transaction:
    if not isinstance(data, dict):
        raise CreditsContractError("transaction is not a JSON object")
    got_kind = _string(data, "kind")
    if got_kind not in TRANSACTION_KINDS or (kind is not None and got_kind != kind):
        raise CreditsContractError(f"unexpected transaction kind {got_kind!r}")
    name = _string(data, "username")
    if name != username:
        raise CreditsContractError(f"asked about account {username!r}, got {name!r}")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise CreditsContractError("`metadata` is not an object of strings")
    created_at = _timestamp(data, "created_at")
    assert created_at is not None
    return Transaction(
        transaction_id=_string(data, "transaction_id"),
        kind=got_kind,
        username=name,
        amount=answer_amount(data.get("amount"), "amount"),
        balance=answer_amount(data.get("balance"), "balance"),
        created_at=created_at,
        reason=_string(data, "reason", required=False),
        debit_id=_string(data, "debit_id", required=False),
        metadata=dict(metadata),
        replayed=replayed,
    )
