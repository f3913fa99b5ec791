"""The ledger: accounts and append-only transactions.

Revision ID: 0001_ledger
Revises:
Create Date: 2025-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_ledger"
down_revision = None
branch_labels = None
depends_on = None

_APPEND_ONLY = "the ledger is append-only: transactions are never updated or deleted"


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("username", sa.String(255), nullable=False),
        sa.Column("balance_cents", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("balance_cents >= 0", name="ck_accounts_balance_nonnegative"),
        sa.UniqueConstraint("username", name="uq_accounts_username"),
    )
    op.create_table(
        "transactions",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("transaction_id", sa.String(40), nullable=False),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("balance_cents", sa.BigInteger(), nullable=False),
        sa.Column(
            "debit_id", sa.String(40), sa.ForeignKey("transactions.transaction_id"), nullable=True
        ),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("metadata_json", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("transaction_id", name="uq_transactions_transaction_id"),
        sa.UniqueConstraint(
            "account_id", "kind", "idempotency_key", name="uq_transactions_idempotency"
        ),
        sa.CheckConstraint("kind IN ('debit', 'refund', 'grant')", name="ck_transactions_kind"),
        sa.CheckConstraint("amount_cents > 0", name="ck_transactions_amount_positive"),
    )
    op.create_index("ix_transactions_account_seq", "transactions", ["account_id", "seq"])
    op.create_index("ix_transactions_debit_id", "transactions", ["debit_id"])

    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION credits_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{_APPEND_ONLY}'; END; $$"
        )
        op.execute(
            "CREATE TRIGGER transactions_append_only BEFORE UPDATE OR DELETE ON transactions "
            "FOR EACH ROW EXECUTE FUNCTION credits_ledger_append_only()"
        )
        op.execute(
            "CREATE TRIGGER transactions_no_truncate BEFORE TRUNCATE ON transactions "
            "FOR EACH STATEMENT EXECUTE FUNCTION credits_ledger_append_only()"
        )
    else:
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER transactions_no_{event.lower()} BEFORE {event} ON transactions "
                f"BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}'); END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER transactions_no_truncate ON transactions")
        op.execute("DROP TRIGGER transactions_append_only ON transactions")
        op.execute("DROP FUNCTION credits_ledger_append_only()")
    else:
        op.execute("DROP TRIGGER transactions_no_update")
        op.execute("DROP TRIGGER transactions_no_delete")
    op.drop_index("ix_transactions_debit_id", table_name="transactions")
    op.drop_index("ix_transactions_account_seq", table_name="transactions")
    op.drop_table("transactions")
    op.drop_table("accounts")
