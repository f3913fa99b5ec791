"""The reference credits service's tables: accounts and an append-only ledger.

- ``accounts`` holds one row per user with the current balance, in whole hundredths of a
  credit (``balance_cents``), never below zero (a CHECK constraint backs the service's own
  check).
- ``transactions`` is the ledger: one row per debit, refund and grant, never updated or
  deleted (triggers created by the first migration refuse both).  Each row keeps the
  Idempotency-Key it was written with and a SHA-256 of the request, unique per account,
  kind and key, so a replay finds the original and a different body is a conflict.
- Text is stored exactly: what a text column of either database cannot hold (NUL, lone
  surrogates; see :func:`storable`) is kept as ASCII JSON (``metadata_json`` always,
  ``reason_json`` for such a reason only).

Amounts are integers of hundredths so SQLite, which has no exact decimal type, stays
exact; :mod:`hub_ext.credits.amounts` converts.  The schema is created by the Alembic
migrations in ``hub_ext/credits/migrations``, never by ``create_all``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ..common.clock import utcnow

__all__ = ["Account", "Base", "LedgerEntry", "UTCDateTime", "storable", "utcnow"]

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> bool:
    """Whether a text column of both databases holds ``text`` as it is: PostgreSQL's text
    refuses NUL, and a lone surrogate (JSON's ``"\\ud800"``; a valid pair decodes to one
    character) is not UTF-8, which both drivers write."""
    return _UNSTORABLE.search(text) is None


def readable(text: str) -> str:
    """``text`` with U+FFFD in place of what :func:`storable` refuses: a readable copy."""
    return _UNSTORABLE.sub("\ufffd", text)


class UTCDateTime(TypeDecorator):
    """A timestamp stored as naive UTC and read back timezone-aware, on SQLite and PostgreSQL."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class Account(Base):
    """One user's credits account; created by the first grant."""

    __tablename__ = "accounts"
    __table_args__ = (
        CheckConstraint("balance_cents >= 0", name="ck_accounts_balance_nonnegative"),
        UniqueConstraint("username", name="uq_accounts_username"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(255), nullable=False)
    balance_cents: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class LedgerEntry(Base):
    """One debit, refund or grant; append-only.

    ``seq`` orders the ledger (newest = highest); ``transaction_id`` is the public id.
    ``balance_cents`` is the account's balance right after this entry.  ``reason_json`` is
    NULL unless the reason is not :func:`storable`; then it holds the exact reason as ASCII
    JSON and ``reason`` a :func:`readable` copy.
    """

    __tablename__ = "transactions"
    __table_args__ = (
        UniqueConstraint("transaction_id", name="uq_transactions_transaction_id"),
        UniqueConstraint(
            "account_id", "kind", "idempotency_key", name="uq_transactions_idempotency"
        ),
        CheckConstraint("kind IN ('debit', 'refund', 'grant')", name="ck_transactions_kind"),
        CheckConstraint("amount_cents > 0", name="ck_transactions_amount_positive"),
        Index("ix_transactions_account_seq", "account_id", "seq"),
        Index("ix_transactions_debit_id", "debit_id"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    transaction_id: Mapped[str] = mapped_column(String(40), nullable=False)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), nullable=False)
    kind: Mapped[str] = mapped_column(String(10), nullable=False)
    amount_cents: Mapped[int] = mapped_column(BigInteger, nullable=False)
    balance_cents: Mapped[int] = mapped_column(BigInteger, nullable=False)
    debit_id: Mapped[str | None] = mapped_column(
        ForeignKey("transactions.transaction_id"), nullable=True
    )
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    reason_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    metadata_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    idempotency_key: Mapped[str] = mapped_column(String(255), nullable=False)
    request_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
