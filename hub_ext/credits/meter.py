"""The credits meter: the settling half of :class:`hub_ext.credits.hook.CreditsHook`.

:class:`CreditsMeter` is mixed into the hook.  It keeps the books of every server run this
hub process meters (:class:`MeteredRun`), makes the Credits API calls that charge each
interval as it begins and settle a run that stopped (the unused part of the current
interval refunded pro rata; a start that failed refunded whole), and runs the meter: one
periodic pass (``c.CreditsHook.meter_period`` seconds, :func:`hub_ext.common.periodic.every`) that
charges due intervals, retries what the API could not take, refunds lost spawn debits
(:mod:`hub_ext.credits.voids`) and stops a server whose member ran out of credits after
``c.CreditsHook.grace_period``.  Everything owed is written to the hub database before it
is tried (:mod:`hub_ext.credits.unsettled`).  Idempotency-Keys come from
:mod:`hub_ext.credits.metering`, so a retry or a hub restart never charges twice.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from ..common.notices import notices
from ..common.periodic import ensure_task, every
from ..spawn.hooks import PENDING
from ..spawn.stopping import stop_server
from .account import remember_balance
from .affordability import _money
from .errors import AccountNotFound, CreditsError, InsufficientCredits
from .metering import (
    MeterRecord,
    debit_key,
    interval_index,
    refund_amount,
    refund_key,
)
from .unsettled import Owed
from .voids import UNCERTAIN as _UNCERTAIN
from .voids import Void, refund_lost_debit

__all__ = ["CreditsMeter", "MeteredRun", "written_ahead"]


def written_ahead(state: dict) -> dict:
    """The record in a write-ahead state (``PENDING`` set), as :meth:`MeterRecord.to_state`
    wrote it."""
    return {k: v for k, v in state.items() if k != PENDING}


def _whose(record: MeterRecord, now: datetime) -> str:
    """ "Your credits", or "The course ml101's credits" when the course pays now."""
    if record.course_pays(interval_index(record.started_at, now, record.interval)):
        return f"The course {record.course}'s credits"
    return "Your credits"


@dataclass
class MeteredRun:
    """One server run this hub process meters."""

    record: MeterRecord
    spawner: Any
    last_seen: datetime
    stopped_at: datetime | None = None
    charge_to_stop: bool = True
    stopping: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def user(self):
        """The spawner's JupyterHub user; None for a run read back from the database."""
        return getattr(self.spawner, "user", None)


class CreditsMeter:
    """The books, the API calls that settle them, and the meter of
    :class:`hub_ext.credits.hook.CreditsHook` (a mixin: it reads the hook's traits)."""

    # -- bookkeeping -------------------------------------------------------------------------

    def _track(self, spawner, record: MeterRecord) -> None:
        spawner.hook_state[self.name] = record.to_state()
        self._metered[record.server_id] = MeteredRun(record, spawner, self.now())
        self.ensure_meter()

    def _forget_state(self, spawner) -> MeteredRun | None:
        """Take this server's record out of its spawner state; the settling stays with us.

        DockerSpawner's ``stop()`` clears spawner state before our ``after_stop`` runs, so
        the run is also found by its spawner.  None when there is nothing (left) to settle.
        """
        state = spawner.hook_state.pop(self.name, None)
        metered = None
        if isinstance(state, dict):
            try:
                metered = self._metered.get(MeterRecord.from_state(state).server_id)
            except ValueError:
                pass
        if metered is None:
            metered = next(
                (
                    m
                    for m in self._metered.values()
                    if m.spawner is spawner and m.stopped_at is None
                ),
                None,
            )
        if metered is None or metered.stopped_at is not None:
            return None
        return metered

    def _running(self, metered: MeteredRun) -> bool:
        """Whether the spawner still holds this run: it has a server (or one is on its way)
        and its state still names this run (JupyterHub's clear_state empties it)."""
        spawner = metered.spawner
        if getattr(spawner, "server", None) is None and not getattr(spawner, "pending", None):
            return False
        state = getattr(spawner, "hook_state", {}).get(self.name)
        return (
            isinstance(state, dict)
            and state.get("started_at") == (metered.record.started_at.isoformat())
            and state.get("username") == metered.record.username
        )

    def _save(self, metered: MeteredRun) -> None:
        """Write the record into spawner state and, for a running server, the hub database."""
        spawner = metered.spawner
        if metered.stopped_at is not None or not self._running(metered):
            return
        spawner.hook_state[self.name] = metered.record.to_state()
        persist = getattr(spawner, "persist_state", None)
        if persist is None or getattr(spawner, "pending", None):
            return
        try:
            persist()
        except Exception:
            self.log.exception("Could not save the credits state of %s", metered.record.label)

    # -- API calls ---------------------------------------------------------------------------

    async def _debit(self, record: MeterRecord, index: int):
        entry = await self.client.debit(
            record.account(index),
            record.amount,
            key=debit_key(record.server_id, index),
            reason=record.reason(index),
            metadata=record.metadata(index),
        )
        self.log.info(
            "Debited %s credits from %s for interval %d of %s (%s%s), balance %s",
            entry.amount,
            record.account(index),
            index,
            record.label,
            entry.transaction_id,
            ", replay" if entry.replayed else "",
            entry.balance,
        )
        return entry

    async def _charge_due(self, metered: MeteredRun, until: datetime, final: bool) -> bool:
        """Debit every interval begun by ``until`` and not paid yet.

        Returns False when the API could not be reached (try again later).  A refusal for
        lack of credits is recorded in the record (grace period) and ends the pass.
        """
        record = metered.record
        last = interval_index(record.started_at, until, record.interval)
        if final and last > 0 and record.interval_start(last) >= until:
            last -= 1  # stopped exactly at a boundary: the next interval was never begun
        for index in range(last + 1):
            if index in record.debits:
                continue
            try:
                entry = await self._debit(record, index)
            except (InsufficientCredits, AccountNotFound) as e:
                balance = getattr(e, "balance", None) or Decimal("0.00")
                if not final and record.refused_at is None:
                    record.refused_at = self.now()
                    record.refused_balance = balance
                    self.log.warning(
                        "Credits of %s ran out (balance %s): interval %d of %s refused; "
                        "stopping it in %gs unless credits are added",
                        record.username,
                        _money(balance),
                        index,
                        record.label,
                        self.grace_period,
                    )
                    self._save(metered)
                return True
            except _UNCERTAIN as e:
                self.log.warning(
                    "Debit of interval %d of %s failed (%s); retrying at the "
                    "next pass with the same key",
                    index,
                    record.label,
                    e,
                )
                return False
            except CreditsError as e:
                self.log.error(
                    "Debit of interval %d of %s refused: %s; not retried", index, record.label, e
                )
                return True
            record.debits[index] = entry.transaction_id
            if not record.course_pays(index):
                await remember_balance(metered.user, entry.balance, self.log)
            if record.refused_at is not None:
                record.refused_at = record.refused_balance = None
                notices().withdraw(record.username, record.server_name, self.name)
            self._save(metered)
        return True

    async def _settle(self, metered: MeteredRun) -> bool:
        """Final charges and the pro rata refund of a stopped server.  True when done."""
        record, stopped_at = metered.record, metered.stopped_at
        assert stopped_at is not None
        if metered.charge_to_stop and not await self._charge_due(metered, stopped_at, True):
            return False
        last = interval_index(record.started_at, stopped_at, record.interval)
        for index, debit_id in sorted(record.debits.items()):
            if index < last or index in record.refunds:
                continue
            amount = refund_amount(
                record.amount, record.started_at, record.interval, index, stopped_at
            )
            if amount > 0:
                try:
                    entry = await self.client.refund(
                        record.account(index),
                        debit_id,
                        amount,
                        key=refund_key(record.server_id, index),
                        reason=f"Unused part of interval {index} of {record.refunded}",
                    )
                except _UNCERTAIN as e:
                    self.log.warning(
                        "Refund of %s credits to %s failed (%s); retrying",
                        amount,
                        record.username,
                        e,
                    )
                    return False
                except CreditsError as e:
                    self.log.error(
                        "Refund of %s credits of %s to %s refused: %s",
                        amount,
                        debit_id,
                        record.username,
                        e,
                    )
                    amount = Decimal(0)
                else:
                    self.log.info(
                        "Refunded %s credits to %s for %s (interval %d, %s), balance %s",
                        entry.amount,
                        record.account(index),
                        record.label,
                        index,
                        entry.transaction_id,
                        entry.balance,
                    )
                    if not record.course_pays(index):
                        await remember_balance(metered.user, entry.balance, self.log)
            record.refunds[index] = amount
        return True

    async def _settle_now(self, metered: MeteredRun, why: str) -> None:
        """Settle at once, within spawn_timeout; what is left goes to the meter.  The hub
        database holds it until it is done (:mod:`hub_ext.credits.unsettled`)."""

        async def settle() -> bool:
            async with metered.lock:
                return await self._settle(metered)

        self._owe(metered)
        try:
            async with asyncio.timeout(self.spawn_timeout):
                done = await settle()
        except Exception as e:  # noqa: BLE001 - never fail a stop; the meter retries
            self.log.warning(
                "Settling the credits of %s (%s) failed: %r; the meter retries",
                metered.record.label,
                why,
                e,
            )
            done = False
        if done:
            self._settled(metered)
        else:
            self.ensure_meter()

    def _owe(self, metered: MeteredRun) -> None:
        """Write the settlement of a stopped run to the hub database, before it is tried."""
        self.unsettled.keep(
            Owed("stop", metered.record, metered.stopped_at, metered.charge_to_stop),
            metered.spawner,
        )

    def _settled(self, metered: MeteredRun) -> None:
        self._metered.pop(metered.record.server_id, None)
        self.unsettled.drop(metered.record.server_id)

    async def _void_unfinished(self, state: dict, spawner=None) -> None:
        """Refund the first debit of a start the hub never finished, if it was made."""
        try:
            record = MeterRecord.from_state(written_ahead(state))
        except ValueError as e:
            self.log.error("Cannot settle an unfinished start: %s", e)
            return
        # settled once, whichever sees it first: Spawner.stop (after_stop) or the meter
        self._unfinished.pop(record.server_id, None)
        void = Void(record, time.monotonic(), why="did not finish (the hub stopped)")
        self.unsettled.keep(Owed("void", record, why=void.why), spawner)
        if not await self._settle_void(void):
            self._voids.append(void)
            self.ensure_meter()

    async def _settle_void(self, void: Void) -> bool:
        """Refund a spawn debit whose answer was lost, if it was made.  True when done."""
        done = await refund_lost_debit(self.client, void, self.log)
        if done:
            self.unsettled.drop(void.record.server_id)
        return done

    def resume_unsettled(self, db) -> None:
        """At hub start: take over the settlements a previous hub left in the database
        ``db`` (JupyterHub's session); the meter retries them with their first keys."""
        self.unsettled.attach(db)
        owed = self.unsettled.load()
        for one in owed:
            record = one.record
            if one.kind == "void":
                self._voids.append(Void(record, 0.0, why=one.why))
            elif record.server_id not in self._metered:
                self._metered[record.server_id] = MeteredRun(
                    record,
                    None,
                    one.stopped_at,
                    stopped_at=one.stopped_at,
                    charge_to_stop=one.charge_to_stop,
                )
            self.log.warning(
                "Credits of %s left unsettled by the previous hub (%s); the meter settles them",
                record.label,
                one.kind,
            )
        if owed:
            self.ensure_meter()

    # -- the meter ---------------------------------------------------------------------------

    def ensure_meter(self) -> None:
        """Start the meter task once per hub process (needs a running event loop)."""
        self._meter_task = ensure_task(
            self._meter_task,
            lambda: every(
                lambda: self.meter_period, self.meter_once, self.log, "Credits meter pass"
            ),
        )

    async def meter_once(self) -> None:
        """One pass: due debits, grace periods, vanished servers, pending settlements."""
        gate = asyncio.Semaphore(8)

        async def one(metered: MeteredRun) -> None:
            async with gate:
                try:
                    await self._meter_one(metered)
                except Exception:
                    self.log.exception("Metering %s failed", metered.record.label)

        await asyncio.gather(*(one(m) for m in list(self._metered.values())))
        for server_id, (state, spawner) in list(self._unfinished.items()):
            if server_id in self._metered:  # its container took over (labels)
                del self._unfinished[server_id]
            elif spawner.hook_state.get(self.name) is not state and not spawner.pending:
                # JupyterHub cleared it (no container; User.stop without Spawner.stop)
                await self._void_unfinished(state, spawner)
        now = time.monotonic()
        for void in [v for v in self._voids if v.not_before <= now]:
            if await self._settle_void(void):
                self._voids.remove(void)

    async def _meter_one(self, metered: MeteredRun) -> None:
        record = metered.record
        if metered.stopped_at is None and not self._running(metered):
            # cleared without stop() (e.g. its container was found dead): settle, no
            # further charges, from the last time we saw it
            self.log.warning("%s is no longer running; settling its credits", record.label)
            metered.stopped_at = metered.last_seen
            metered.charge_to_stop = False
            self._owe(metered)
        async with metered.lock:
            if metered.stopped_at is not None:
                if record.server_id in self._metered and await self._settle(metered):
                    self._settled(metered)
                return
            now = self.now()
            metered.last_seen = now
            if getattr(metered.spawner, "pending", None):
                return  # spawning, stopping, or JupyterHub checks it after a restart
            await self._charge_due(metered, now, final=False)
        if record.refused_at is not None and metered.stopped_at is None:
            deadline = record.refused_at + timedelta(seconds=self.grace_period)
            balance = _money(record.refused_balance)
            server = f"server '{record.server_name}'" if record.server_name else "server"
            if now >= deadline:
                await self._stop_for_credits(metered, balance, server)
            else:
                minutes = max(1, round((deadline - now).total_seconds() / 60))
                notices().post(
                    record.username,
                    record.server_name,
                    self.name,
                    f"{_whose(record, now)} ran out (balance {balance}): your {server} will be "
                    f"stopped in about {minutes} min unless credits are added.",
                )

    async def _stop_for_credits(self, metered: MeteredRun, balance: str, server: str) -> None:
        """Stop the server as JupyterHub's stop handler does (:func:`stop_server`)."""
        spawner, record = metered.spawner, metered.record
        if metered.stopping or getattr(spawner, "pending", None):
            return
        metered.stopping = True
        notices().post(
            record.username,
            record.server_name,
            self.name,
            f"Your {server} was stopped because {_whose(record, self.now()).lower()} ran "
            f"out (balance {balance}).",
        )
        self.log.warning(
            "Stopping %s: credits ran out (balance %s) and the grace period of %gs is over",
            record.label,
            balance,
            self.grace_period,
        )
        try:
            await stop_server(spawner, "credits")
        except Exception:
            metered.stopping = False
            self.log.exception("Could not stop %s after its credits ran out", record.label)
