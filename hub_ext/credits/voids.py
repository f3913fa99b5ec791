"""Spawn-time debits to give back if they were made: their answer was lost, or the hub
stopped before the start they paid for finished.

The hook cannot know whether such a debit (interval 0 of a server run) reached the
ledger, so :func:`refund_lost_debit` looks for it among the member's transactions (by the
``server_id`` and ``interval`` of its metadata, :meth:`MeterRecord.metadata`) and refunds
it whole, under the run's interval-0 refund key (:func:`hub_ext.credits.metering.refund_key`):
asked twice, the Credits API answers with the first refund.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .client import CreditsClient
from .errors import AccountNotFound, CreditsContractError, CreditsError, CreditsUnavailable
from .metering import MeterRecord, refund_key

__all__ = ["Void", "refund_lost_debit"]

#: Errors after which a write may or may not have been made (the answer was lost).
UNCERTAIN = (CreditsUnavailable, CreditsContractError, TimeoutError)


@dataclass
class Void:
    """A spawn-time debit to refund if it was made; not tried before ``not_before``
    (``time.monotonic()`` seconds)."""

    record: MeterRecord
    not_before: float
    why: str = "was refused"  # "Spawn of <server> ..." in the refund's reason


async def refund_lost_debit(client: CreditsClient, void: Void, log: logging.Logger) -> bool:
    """Refund ``void``'s debit in full if the ledger has it.  True when done (refunded, or
    there is nothing to refund); False when the API cannot tell yet (try again).  Never
    raises a :class:`CreditsError`."""
    record = void.record
    try:
        page, _ = await client.transactions(record.account(0), limit=100)
    except AccountNotFound:
        return True
    except CreditsError as e:
        log.warning("Cannot check the lost debit of %s yet: %s", record.label, e)
        return False
    for entry in page:
        if (
            entry.kind == "debit"
            and entry.metadata.get("server_id") == record.server_id
            and entry.metadata.get("interval") == "0"
        ):
            try:
                await client.refund(
                    record.account(0),
                    entry.transaction_id,
                    entry.amount,
                    key=refund_key(record.server_id, 0),
                    reason=f"Spawn of {record.label} {void.why}",
                )
            except UNCERTAIN:
                return False
            except CreditsError as e:
                log.error("Refund of the lost debit %s failed: %s", entry.transaction_id, e)
            log.warning(
                "Refunded %s credits to %s: the debit of a spawn that %s (%s)",
                entry.amount,
                record.account(0),
                void.why,
                entry.transaction_id,
            )
            return True
    return True
