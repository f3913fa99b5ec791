"""The ledger's rules: what a debit, refund and grant do to an account, atomically.

Every write is one database transaction that

1. locks the account (``SELECT ... FOR UPDATE`` on PostgreSQL; on SQLite the whole write
   already holds the database's write lock from ``BEGIN IMMEDIATE``, see
   :mod:`hub_ext.credits.db`), creating it first for a grant;
2. looks the Idempotency-Key up among the account's entries of the same kind: the same
   request hash is a replay (the original entry, ``replayed=True``), another hash is a
   conflict (409);
3. checks the rule (debit: balance never below zero, 402; refund: never more than what is
   left of the debit, 422), appends one ledger entry and moves the balance.

Because the key is checked under the lock, two concurrent requests with one key cannot
both write; the unique constraint on (account, kind, key) backs this up.  A refused write
(402, 422) stores nothing, so its key may be used again once the reason is gone.

Functions here are blocking; the service runs them in worker threads.  They return
JSON-ready dicts in the contract's shapes (``hub_ext/credits/openapi.yaml``) and raise
:class:`LedgerError` with the HTTP status and ``error`` code of a refusal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from . import models
from .amounts import MAX_CENTS, format_cents
from .db import READ_ONLY
from .models import Account, LedgerEntry, readable, storable

__all__ = ["Ledger", "LedgerError", "WriteRequest"]

log = logging.getLogger(__name__)


class LedgerError(Exception):
    """A refusal: ``status`` and ``code`` go into the contract's ``Error`` answer."""

    def __init__(self, status: int, code: str, message: str, *, balance_cents: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.balance_cents = balance_cents

    def to_json(self) -> dict:
        body: dict = {"error": self.code, "message": self.message}
        if self.balance_cents is not None:
            body["balance"] = format_cents(self.balance_cents)
        return body


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """A validated write: amount in hundredths of a credit, the Idempotency-Key, the rest."""

    username: str
    key: str
    amount_cents: int
    reason: str | None = None
    metadata: dict[str, str] | None = None
    debit_id: str | None = None

    def request_hash(self, kind: str) -> str:
        """SHA-256 of what makes two requests "the same body" (amounts compared by value)."""
        canonical = json.dumps(
            {
                "kind": kind,
                "amount_cents": self.amount_cents,
                "reason": self.reason,
                "metadata": self.metadata,
                "debit_id": self.debit_id,
            },
            sort_keys=True,
            ensure_ascii=True,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


def _timestamp(value: datetime) -> str:
    return value.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _entry_json(entry: LedgerEntry, username: str) -> dict:
    body: dict = {
        "transaction_id": entry.transaction_id,
        "kind": entry.kind,
        "username": username,
        "amount": format_cents(entry.amount_cents),
        "balance": format_cents(entry.balance_cents),
        "debit_id": entry.debit_id,
        "created_at": _timestamp(entry.created_at),
    }
    if entry.reason_json is not None:
        body["reason"] = json.loads(entry.reason_json)
    elif entry.reason is not None:
        body["reason"] = entry.reason
    if entry.metadata_json is not None:
        body["metadata"] = json.loads(entry.metadata_json)
    return body


def _reason_columns(reason: str | None) -> dict[str, str | None]:
    """``reason`` as the ledger stores it: as it is, or (not :func:`storable`) a readable copy
    beside the exact text as ASCII JSON."""
    if reason is None or storable(reason):
        return {"reason": reason, "reason_json": None}
    return {"reason": readable(reason), "reason_json": json.dumps(reason, ensure_ascii=True)}


def _not_found(username: str) -> LedgerError:
    return LedgerError(404, "account_not_found", f"No credits account for user {username!r}.")


class Ledger:
    """The ledger on one database engine; all methods block and are thread-safe."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._write_session = sessionmaker(engine, expire_on_commit=False)
        self._read_session = sessionmaker(
            engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False
        )
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert

    # -- reads --------------------------------------------------------------------------

    def account(self, username: str) -> dict:
        """The ``Account`` answer for ``username``; 404 ``account_not_found``."""
        with self._read_session() as session, session.begin():
            account = session.scalar(select(Account).where(Account.username == username))
            if account is None:
                raise _not_found(username)
            return {
                "username": account.username,
                "balance": format_cents(account.balance_cents),
                "updated_at": _timestamp(account.updated_at),
            }

    def transactions(self, username: str, limit: int, before: str | None) -> dict:
        """One page of the ledger, newest first; ``next_before`` is set when more remain.

        404 ``account_not_found``, or 404 ``transaction_not_found`` when ``before`` is not a
        transaction of this account.
        """
        with self._read_session() as session, session.begin():
            account = session.scalar(select(Account).where(Account.username == username))
            if account is None:
                raise _not_found(username)
            query = (
                select(LedgerEntry)
                .where(LedgerEntry.account_id == account.id)
                .order_by(LedgerEntry.seq.desc())
                .limit(limit + 1)
            )
            if before is not None:
                before_seq = session.scalar(
                    select(LedgerEntry.seq).where(
                        LedgerEntry.transaction_id == before,
                        LedgerEntry.account_id == account.id,
                    )
                )
                if before_seq is None:
                    raise LedgerError(
                        404,
                        "transaction_not_found",
                        f"No transaction {before!r} in the ledger of {username!r}.",
                    )
                query = query.where(LedgerEntry.seq < before_seq)
            entries = list(session.scalars(query))
            more = len(entries) > limit
            entries = entries[:limit]
            return {
                "transactions": [_entry_json(entry, username) for entry in entries],
                "next_before": entries[-1].transaction_id if more else None,
            }

    # -- writes -------------------------------------------------------------------------

    def debit(self, request: WriteRequest) -> tuple[dict, bool]:
        """Take credits; 402 ``insufficient_credits`` (with the balance) takes nothing."""

        def apply(session: Session, account: Account) -> int:
            if account.balance_cents < request.amount_cents:
                raise LedgerError(
                    402,
                    "insufficient_credits",
                    f"Balance {format_cents(account.balance_cents)} is less than "
                    f"{format_cents(request.amount_cents)} credits; nothing was taken.",
                    balance_cents=account.balance_cents,
                )
            return account.balance_cents - request.amount_cents

        return self._write("debit", request, apply)

    def refund(self, request: WriteRequest) -> tuple[dict, bool]:
        """Give back part or all of a debit; 422 ``refund_exceeds_debit`` past its amount,
        404 ``debit_not_found`` when ``debit_id`` names no debit of the account (contract 1.1)."""

        def apply(session: Session, account: Account) -> int:
            debit = session.scalar(
                select(LedgerEntry).where(
                    LedgerEntry.transaction_id == request.debit_id,
                    LedgerEntry.account_id == account.id,
                    LedgerEntry.kind == "debit",
                )
            )
            if debit is None:
                raise LedgerError(
                    404,
                    "debit_not_found",
                    f"{request.debit_id!r} is not a debit of {request.username!r}.",
                )
            refunded = session.scalar(
                select(func.coalesce(func.sum(LedgerEntry.amount_cents), 0)).where(
                    LedgerEntry.debit_id == debit.transaction_id, LedgerEntry.kind == "refund"
                )
            )
            left = debit.amount_cents - int(refunded)  # SUM(bigint) is numeric on PostgreSQL
            if request.amount_cents > left:
                raise LedgerError(
                    422,
                    "refund_exceeds_debit",
                    f"Only {format_cents(left)} of debit {debit.transaction_id} "
                    f"({format_cents(debit.amount_cents)}) is left to refund.",
                )
            return self._added(account, request.amount_cents)

        return self._write("refund", request, apply)

    def grant(self, request: WriteRequest) -> tuple[dict, bool]:
        """Add credits, creating the account on its first grant."""
        return self._write(
            "grant", request, lambda session, account: self._added(account, request.amount_cents)
        )

    @staticmethod
    def _added(account: Account, cents: int) -> int:
        balance = account.balance_cents + cents
        if balance > MAX_CENTS:
            raise LedgerError(
                422,
                "balance_too_large",
                "The balance would exceed 999999999999.99 credits, the largest amount "
                "the API can express.",
            )
        return balance

    def _write(
        self,
        kind: str,
        request: WriteRequest,
        apply: Callable[[Session, Account], int],
    ) -> tuple[dict, bool]:
        request_hash = request.request_hash(kind)
        try:
            return self._write_once(kind, request, request_hash, apply)
        except IntegrityError:
            # Only another writer that slipped past the lock can cause this (e.g. two
            # service processes on one database); its entry is committed, so retry once.
            log.warning(
                "Ledger %s for %s key=%s raced; retrying", kind, request.username, request.key
            )
            return self._write_once(kind, request, request_hash, apply)

    def _write_once(
        self,
        kind: str,
        request: WriteRequest,
        request_hash: str,
        apply: Callable[[Session, Account], int],
    ) -> tuple[dict, bool]:
        now = models.utcnow()
        with self._write_session() as session, session.begin():
            if kind == "grant":
                session.execute(
                    self._insert(Account)
                    .values(
                        username=request.username, balance_cents=0, created_at=now, updated_at=now
                    )
                    .on_conflict_do_nothing(index_elements=["username"])
                )
            account = session.scalar(
                select(Account).where(Account.username == request.username).with_for_update()
            )
            if account is None:
                raise _not_found(request.username)
            existing = session.scalar(
                select(LedgerEntry).where(
                    LedgerEntry.account_id == account.id,
                    LedgerEntry.kind == kind,
                    LedgerEntry.idempotency_key == request.key,
                )
            )
            if existing is not None:
                if existing.request_hash != request_hash:
                    raise LedgerError(
                        409,
                        "idempotency_conflict",
                        f"Idempotency-Key {request.key!r} was already used for a different "
                        f"{kind} on this account.",
                    )
                return _entry_json(existing, request.username), True
            balance = apply(session, account)
            entry = LedgerEntry(
                transaction_id="txn_" + uuid.uuid4().hex,
                account_id=account.id,
                kind=kind,
                amount_cents=request.amount_cents,
                balance_cents=balance,
                debit_id=request.debit_id,
                **_reason_columns(request.reason),
                metadata_json=(
                    None
                    if request.metadata is None
                    else json.dumps(request.metadata, sort_keys=True, ensure_ascii=True)
                ),
                idempotency_key=request.key,
                request_hash=request_hash,
                created_at=now,
            )
            account.balance_cents = balance
            account.updated_at = now
            session.add(entry)
            session.flush()
            return _entry_json(entry, request.username), False
