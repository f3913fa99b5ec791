"""The exact reason of an entry whose reason a text column cannot hold.

A ``reason`` may be any JSON string of at most 500 characters (the contract), NUL and lone
surrogates (``"\\ud800"``) included, which PostgreSQL's text refuses and neither driver
encodes.  Such a reason is kept as ASCII JSON in ``reason_json``, and ``reason`` holds a
readable copy with U+FFFD in their place; every other entry leaves ``reason_json`` NULL.

Revision ID: 0002_reason_json
Revises: 0001_ledger
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_reason_json"
down_revision = "0001_ledger"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("transactions", sa.Column("reason_json", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("transactions", "reason_json")
