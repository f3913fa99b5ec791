"""CreditsHook: pay for a server before it starts, then for every interval it runs.

Used as a spawner hook (:attr:`hub_ext.docker.spawner.GPUDockerSpawner.before_container_hooks`)::

    c.GPUDockerSpawner.before_container_hooks = ["hub_ext.credits.hook.CreditsHook"]

A start runs: profile -> :meth:`CreditsHook.before_reserve` (can the balance pay the first
interval? so a member who cannot pay never holds a GPU) -> GPUs ->
:meth:`CreditsHook.before_container` (debit of the first interval at the profile's
``credits_per_hour``) -> container.  A refusal is an immediate
``tornado.web.HTTPError`` with a sentence a member understands: 402 when the balance is too
low, 503 when the Credits API cannot be reached (fail closed, unless
``c.CreditsHook.fail_open``).  The spawner releases the GPUs when a hook refuses, and calls
:meth:`undo` (a full refund) when a later step fails.

While the server runs, a meter (one task per hub process) debits each further interval
when it begins.  Amounts, interval numbers and Idempotency-Keys come from
:mod:`hub_ext.credits.metering`: a key names the server run and the interval, so a retry
or a hub restart never charges twice and never skips an interval.  The meter's books for a
server live in ``spawner.hook_state["credits"]``, which the spawner keeps in its (versioned)
spawner state and hands back through :meth:`restore` after a restart.

- A metering debit refused for lack of credits starts a grace period
  (``c.CreditsHook.grace_period``); then the server is stopped the way JupyterHub's own
  stop handler does it (:func:`hub_ext.stopping.stop_server`) and the member reads why on
  the hub's home page (:mod:`hub_ext.notices`, topic ``credits``).
- When the API cannot be reached, servers keep running; the debit is retried at the next
  tick with the same key.
- On stop (:meth:`after_stop`) the unused part of the current interval is refunded pro rata.
  What a stop, a failed start or a lost spawn debit still owes is written to the hub
  database before it is settled (:mod:`hub_ext.credits.unsettled`), so a hub stopped
  while the API cannot be reached settles it, with the same keys, after its restart.
  JupyterHub may also clear a server's state without calling ``stop()`` (its container was
  found dead); the meter notices and settles that server too, without charging further.

Time comes from ``c.CreditsHook.utcnow`` (the pattern of jupyterhub-idle-culler), so tests
can move the clock.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from tornado import web
from traitlets import Bool, Callable, Float, Instance, default, validate
from traitlets.config import SingletonConfigurable

from .. import metrics
from ..auth_credits import remember_balance
from ..hooks import PENDING
from ..notices import notices
from ..periodic import ensure_task, every
from ..stopping import stop_server
from .affordability import UNREACHABLE, Affordability, _money, too_little
from .client import CreditsClient
from .errors import AccountNotFound, CreditsAuthError, CreditsError, InsufficientCredits
from .metering import (
    MeterRecord,
    as_decimal,
    debit_key,
    interval_index,
    refund_amount,
    refund_key,
)
from .unsettled import Owed, UnsettledStore
from .voids import UNCERTAIN as _UNCERTAIN
from .voids import Void, refund_lost_debit

__all__ = ["CreditsHook", "too_little", "utcnow"]

def _written_ahead(state: dict) -> dict:
    """The record in a write-ahead state (``PENDING`` set), as :meth:`MeterRecord.to_state`
    wrote it."""
    return {k: v for k, v in state.items() if k != PENDING}


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the default of ``c.CreditsHook.utcnow``)."""
    return datetime.now(UTC)


@dataclass
class _Metered:
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


class CreditsHook(Affordability, SingletonConfigurable):
    """Debits credits for servers: the first interval at spawn, then each interval it runs.

    All spawner-facing methods take the spawner (a :class:`hub_ext.docker.spawner.GPUDockerSpawner`
    or anything with ``user``, ``name``, ``credits_per_hour``, ``profile_slug``,
    ``hook_state`` and ``emit``).  ``before_reserve`` and ``before_container`` raise
    ``tornado.web.HTTPError``;
    ``undo``, ``after_stop`` and ``restore`` never raise and are idempotent.
    """

    name = "credits"

    interval = Float(
        900.0,
        config=True,
        help="""Seconds of one metering interval; each is paid when it begins, the first
        at spawn.  Changing it affects servers started afterwards.

            c.CreditsHook.interval = 900
        """,
    )

    grace_period = Float(
        300.0,
        config=True,
        help="""Seconds a running server keeps going after a metering debit was refused
        for lack of credits; then it is stopped and the member told why.

            c.CreditsHook.grace_period = 300
        """,
    )

    meter_period = Float(
        30.0,
        config=True,
        help="""Seconds between the meter's passes over running servers (due debits,
        retries, grace periods).  An interval is charged at most this late.

            c.CreditsHook.meter_period = 30
        """,
    )

    spawn_timeout = Float(
        8.0,
        config=True,
        help="""Seconds the spawn-time debit may take, retries included, before the spawn
        is refused (or, with fail_open, started without it).  Keep it below JupyterHub's
        slow_spawn_timeout (10 s) so that the refusal is the answer to the spawn request.

            c.CreditsHook.spawn_timeout = 8
        """,
    )

    fail_open = Bool(
        False,
        config=True,
        help="""Start servers when the Credits API cannot be reached (logged as a warning);
        the meter charges the first interval once the API answers.  Off by default: no
        server starts unpaid.

            c.CreditsHook.fail_open = True
        """,
    )

    utcnow = Callable(
        config=True,
        help="""The clock: a function returning the current time as an aware UTC datetime.
        Tests replace it to move time.

            c.CreditsHook.utcnow = hub_ext.credits.hook.utcnow
        """,
    )

    client = Instance(
        CreditsClient,
        help="The Credits API client; configured by c.CreditsClient.* (url, token, timeout).",
    )

    @default("utcnow")
    def _default_utcnow(self):
        return utcnow

    @default("client")
    def _default_client(self):
        return CreditsClient(parent=self)

    @validate("interval")
    def _validate_interval(self, proposal):
        if proposal["value"] < 1:
            raise ValueError(
                f"c.CreditsHook.interval must be at least 1 second, got {proposal['value']!r}"
            )
        return proposal["value"]

    @validate("grace_period", "spawn_timeout")
    def _validate_not_negative(self, proposal):
        if proposal["value"] < 0:
            raise ValueError(
                f"c.CreditsHook.{proposal['trait'].name} must not be negative, "
                f"got {proposal['value']!r}"
            )
        return proposal["value"]

    @validate("meter_period")
    def _validate_meter_period(self, proposal):
        if proposal["value"] <= 0:
            raise ValueError(
                f"c.CreditsHook.meter_period must be a positive number of seconds, "
                f"got {proposal['value']!r}"
            )
        return proposal["value"]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._metered: dict[str, _Metered] = {}
        self._voids: list[Void] = []
        # starts a killed hub did not finish, by server id: (write-ahead record, spawner)
        self._unfinished: dict[str, tuple[dict, Any]] = {}
        self._meter_task: asyncio.Task | None = None
        self.unsettled = UnsettledStore(self.log)

    def now(self) -> datetime:
        value = self.utcnow()
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    # -- the spawner's hooks ----------------------------------------------------------------

    async def before_container(self, spawner) -> None:
        """Debit the first interval of a priced profile; a free one makes no API call.

        Raises ``HTTPError(402)`` when the balance is too low and ``HTTPError(503)`` when the
        Credits API cannot be reached (unless ``fail_open``).
        """
        username, server_name = spawner.user.name, spawner.name or ""
        spawner.hook_state.pop(self.name, None)
        notices().withdraw(username, server_name, self.name)
        price = as_decimal(spawner.credits_per_hour)
        if price <= 0:
            return
        record = MeterRecord.new(
            username, server_name, getattr(spawner, "profile_slug", "") or "",
            self.now(), price, self.interval,
        )
        minutes = record.interval / 60
        span = f"{minutes:g} minutes" if minutes >= 1 else f"{record.interval:g} seconds"
        spawner.emit(30, f"Debiting {record.amount} credits for the first {span}")
        # write-ahead: a hub killed from here until the container exists (its labels then
        # carry the record) restarts with this in the spawner state, and after_stop
        # refunds the debit if it was made
        spawner.hook_state[self.name] = {**record.to_state(), PENDING: True}
        persist = getattr(spawner, "persist_state", None)
        if persist is not None:
            persist()
        try:
            entry = await self._debit_first(spawner, record)
        except BaseException:
            spawner.hook_state.pop(self.name, None)
            raise
        if entry is None:  # fail_open: started unpaid, tracked by the meter
            return
        record.debits[0] = entry.transaction_id
        self._track(spawner, record)
        spawner.emit(40, f"Debited {record.amount} credits; your balance is {entry.balance}")
        await remember_balance(spawner.user, entry.balance, self.log)

    async def _debit_first(self, spawner, record: MeterRecord):
        """The spawn's debit of interval 0: the ledger entry, or None when the API is down
        and ``fail_open`` lets the server start unpaid.  Raises the refusals of
        :meth:`before_container`."""
        price = record.credits_per_hour
        try:
            # asyncio.timeout, not wait_for: under Python 3.11 wait_for returns the debit's
            # answer when it lands in the same step as the start's cancellation (bpo-42130),
            # and the member's stop would be lost
            async with asyncio.timeout(self.spawn_timeout):
                entry = await self._debit(record, 0)
        except asyncio.CancelledError:
            # the member stopped the start (JupyterHub cancels it: UserServerAPIHandler.delete)
            # or the hub is shutting down, with the debit on its way: it may have reached
            # the ledger, so it is refunded if it did
            self._void_later(spawner, record, "was stopped before it started")
            raise
        except (InsufficientCredits, AccountNotFound) as e:
            balance = getattr(e, "balance", None)
            metrics.SPAWNS_REFUSED.labels(reason="insufficient_credits").inc()
            self.log.warning("Refusing spawn of %s: %s credits for interval 0 refused (%s)",
                             record.label, record.amount, e)
            raise web.HTTPError(402, too_little(price, balance)) from None
        except (CreditsError, TimeoutError) as e:
            why = "timed out" if isinstance(e, TimeoutError) else str(e)
            if isinstance(e, CreditsAuthError):
                self.log.error("Credits API refused the hub's token (check "
                               "c.CreditsClient.token / GPUHUB_CREDITS_TOKEN): %s", e)
            if self.fail_open and isinstance(e, (*_UNCERTAIN, CreditsAuthError)):
                self.log.warning("Credits API unavailable for the spawn of %s (%s); starting "
                                 "it unpaid (fail_open), the meter charges it later",
                                 record.label, why)
                spawner.emit(35, "The credit service cannot be reached; starting anyway, "
                             "the debit follows when it answers")
                self._track(spawner, record)
                return None
            if isinstance(e, _UNCERTAIN):
                self._void_later(spawner, record, "was refused")
            metrics.SPAWNS_REFUSED.labels(reason="credits_unavailable").inc()
            self.log.error("Refusing spawn of %s: the debit of %s credits failed: %s",
                           record.label, record.amount, why)
            raise web.HTTPError(503, UNREACHABLE) from None
        return entry

    def _void_later(self, spawner, record: MeterRecord, why: str) -> None:
        """The spawn's debit may or may not have reached the ledger: the meter refunds it
        if it did (:func:`refund_lost_debit`), kept in the hub database until then."""
        void = Void(record, time.monotonic() + 2 * self.client.timeout, why=why)
        self.unsettled.keep(Owed("void", record, why=void.why), spawner)
        self._voids.append(void)
        self.ensure_meter()

    async def undo(self, spawner) -> None:
        """The start failed after the debit: refund it in full.  Idempotent; never raises."""
        metered = self._forget_state(spawner)
        if metered is None:
            return
        metered.stopped_at = metered.record.started_at
        metered.charge_to_stop = False
        await self._settle_now(metered, "start failed")

    async def after_stop(self, spawner) -> None:
        """The server stopped: charge what is due, refund the rest of the current interval.

        A server whose start a killed hub never finished (its state holds the write-ahead
        record of :meth:`before_container`, and no container took it over) gets its first
        debit back in full, if that debit was made.

        Idempotent; never raises.  When the API cannot be reached the meter retries.
        """
        state = spawner.hook_state.get(self.name)
        if isinstance(state, dict) and state.get(PENDING):
            spawner.hook_state.pop(self.name, None)
            await self._void_unfinished(state, spawner)
            return
        metered = self._forget_state(spawner)
        if metered is None:
            return
        metered.stopped_at = self.now()
        await self._settle_now(metered, "stopped")

    def restore(self, spawner) -> None:
        """The hub restarted with this server in its state: meter it again.  Never raises.

        A write-ahead record (a start the hub did not finish) is not metered: either the
        container's labels replace it (the start got that far) or :meth:`after_stop`
        refunds it.
        """
        state = spawner.hook_state.get(self.name)
        if isinstance(state, dict) and state.get(PENDING):
            self.log.warning("%s: the hub stopped during its start, after the debit began; "
                             "its container decides (running: metered, else refunded)",
                             getattr(spawner, "_log_name", spawner))
            try:
                record = MeterRecord.from_state(_written_ahead(state))
            except ValueError as e:
                self.log.error("Cannot restore an unfinished start: %s", e)
                return
            self._unfinished[record.server_id] = (state, spawner)
            self.ensure_meter()
            return
        try:
            record = MeterRecord.from_state(state)
        except ValueError as e:
            self.log.error("Cannot restore the credits metering of %s: %s",
                           getattr(spawner, "_log_name", spawner), e)
            return
        known = self._metered.get(record.server_id)
        if known is not None:
            for index, debit_id in known.record.debits.items():
                record.debits.setdefault(index, debit_id)
        self._track(spawner, record)
        self.log.info("Metering of %s restored: started %s, %s credits per %gs, intervals %s "
                      "paid", record.label, record.started_at.isoformat(), record.amount,
                      record.interval, sorted(record.debits) or "none")

    # -- bookkeeping -------------------------------------------------------------------------

    def _track(self, spawner, record: MeterRecord) -> None:
        spawner.hook_state[self.name] = record.to_state()
        self._metered[record.server_id] = _Metered(record, spawner, self.now())
        self.ensure_meter()

    def _forget_state(self, spawner) -> _Metered | None:
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
            metered = next((m for m in self._metered.values()
                            if m.spawner is spawner and m.stopped_at is None), None)
        if metered is None or metered.stopped_at is not None:
            return None
        return metered

    def _running(self, metered: _Metered) -> bool:
        """Whether the spawner still holds this run: it has a server (or one is on its way)
        and its state still names this run (JupyterHub's clear_state empties it)."""
        spawner = metered.spawner
        if getattr(spawner, "server", None) is None and not getattr(spawner, "pending", None):
            return False
        state = getattr(spawner, "hook_state", {}).get(self.name)
        return isinstance(state, dict) and state.get("started_at") == (
            metered.record.started_at.isoformat()
        ) and state.get("username") == metered.record.username

    def _save(self, metered: _Metered) -> None:
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
            record.username, record.amount, key=debit_key(record.server_id, index),
            reason=record.reason(index), metadata=record.metadata(index),
        )
        self.log.info("Debited %s credits from %s for interval %d of %s (%s%s), balance %s",
                      entry.amount, record.username, index, record.label,
                      entry.transaction_id, ", replay" if entry.replayed else "", entry.balance)
        return entry

    async def _charge_due(self, metered: _Metered, until: datetime, final: bool) -> bool:
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
                        record.username, _money(balance), index, record.label,
                        self.grace_period)
                    self._save(metered)
                return True
            except _UNCERTAIN as e:
                self.log.warning("Debit of interval %d of %s failed (%s); retrying at the "
                                 "next pass with the same key", index, record.label, e)
                return False
            except CreditsError as e:
                self.log.error("Debit of interval %d of %s refused: %s; not retried",
                               index, record.label, e)
                return True
            record.debits[index] = entry.transaction_id
            await remember_balance(metered.user, entry.balance, self.log)
            if record.refused_at is not None:
                record.refused_at = record.refused_balance = None
                notices().withdraw(record.username, record.server_name, self.name)
            self._save(metered)
        return True

    async def _settle(self, metered: _Metered) -> bool:
        """Final charges and the pro rata refund of a stopped server.  True when done."""
        record, stopped_at = metered.record, metered.stopped_at
        assert stopped_at is not None
        if metered.charge_to_stop and not await self._charge_due(metered, stopped_at, True):
            return False
        last = interval_index(record.started_at, stopped_at, record.interval)
        for index, debit_id in sorted(record.debits.items()):
            if index < last or index in record.refunds:
                continue
            amount = refund_amount(record.amount, record.started_at, record.interval, index,
                                   stopped_at)
            if amount > 0:
                try:
                    entry = await self.client.refund(
                        record.username, debit_id, amount,
                        key=refund_key(record.server_id, index),
                        reason=f"Unused part of interval {index} of {record.label}",
                    )
                except _UNCERTAIN as e:
                    self.log.warning("Refund of %s credits to %s failed (%s); retrying",
                                     amount, record.username, e)
                    return False
                except CreditsError as e:
                    self.log.error("Refund of %s credits of %s to %s refused: %s",
                                   amount, debit_id, record.username, e)
                    amount = Decimal(0)
                else:
                    self.log.info("Refunded %s credits to %s for %s (interval %d, %s), "
                                  "balance %s", entry.amount, record.username, record.label,
                                  index, entry.transaction_id, entry.balance)
                    await remember_balance(metered.user, entry.balance, self.log)
            record.refunds[index] = amount
        return True

    async def _settle_now(self, metered: _Metered, why: str) -> None:
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
            self.log.warning("Settling the credits of %s (%s) failed: %r; the meter retries",
                             metered.record.label, why, e)
            done = False
        if done:
            self._settled(metered)
        else:
            self.ensure_meter()

    def _owe(self, metered: _Metered) -> None:
        """Write the settlement of a stopped run to the hub database, before it is tried."""
        self.unsettled.keep(Owed("stop", metered.record, metered.stopped_at,
                                 metered.charge_to_stop), metered.spawner)

    def _settled(self, metered: _Metered) -> None:
        self._metered.pop(metered.record.server_id, None)
        self.unsettled.drop(metered.record.server_id)

    async def _void_unfinished(self, state: dict, spawner=None) -> None:
        """Refund the first debit of a start the hub never finished, if it was made."""
        try:
            record = MeterRecord.from_state(_written_ahead(state))
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
                self._metered[record.server_id] = _Metered(
                    record, None, one.stopped_at, stopped_at=one.stopped_at,
                    charge_to_stop=one.charge_to_stop)
            self.log.warning("Credits of %s left unsettled by the previous hub (%s); the "
                             "meter settles them", record.label, one.kind)
        if owed:
            self.ensure_meter()

    # -- the meter ---------------------------------------------------------------------------

    def ensure_meter(self) -> None:
        """Start the meter task once per hub process (needs a running event loop)."""
        self._meter_task = ensure_task(self._meter_task, lambda: every(
            lambda: self.meter_period, self.meter_once, self.log, "Credits meter pass"))

    async def meter_once(self) -> None:
        """One pass: due debits, grace periods, vanished servers, pending settlements."""
        gate = asyncio.Semaphore(8)

        async def one(metered: _Metered) -> None:
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

    async def _meter_one(self, metered: _Metered) -> None:
        record = metered.record
        if metered.stopped_at is None and not self._running(metered):
            # cleared without stop() (e.g. its container was found dead): settle, no
            # further charges, from the last time we saw it
            self.log.warning("%s is no longer running; settling its credits",
                             record.label)
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
                    record.username, record.server_name, self.name,
                    f"Your credits ran out (balance {balance}): your {server} will be "
                    f"stopped in about {minutes} min unless credits are added.",
                )

    async def _stop_for_credits(self, metered: _Metered, balance: str, server: str) -> None:
        """Stop the server as JupyterHub's stop handler does (:func:`stop_server`)."""
        spawner, record = metered.spawner, metered.record
        if metered.stopping or getattr(spawner, "pending", None):
            return
        metered.stopping = True
        notices().post(
            record.username, record.server_name, self.name,
            f"Your {server} was stopped because your credits ran out (balance {balance}).",
        )
        self.log.warning("Stopping %s: credits ran out (balance %s) and the grace period of "
                         "%gs is over", record.label, balance, self.grace_period)
        try:
            await stop_server(spawner, "credits")
        except Exception:
            metered.stopping = False
            self.log.exception("Could not stop %s after its credits ran out", record.label)
