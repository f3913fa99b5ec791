"""CreditsHook: pay for a server before it starts, then for every interval it runs.

Used as a spawner hook (:attr:`hub_ext.spawn.core.SpawnerCore.before_container_hooks`,
either backend)::

    c.SpawnerCore.before_container_hooks = ["hub_ext.credits.hook.CreditsHook"]

A start runs: profile -> :meth:`CreditsHook.before_reserve` (can the balance pay the first
interval? so a member who cannot pay never holds a GPU) -> GPUs ->
:meth:`CreditsHook.before_container` (debit of the first interval at the profile's
``credits_per_hour``) -> container.  A refusal is an immediate
``tornado.web.HTTPError`` with a sentence a member understands: 402 when the balance is too
low, 503 when the Credits API cannot be reached (fail closed, unless
``c.CreditsHook.fail_open``).  The spawner releases the GPUs when a hook refuses, and calls
:meth:`undo` (a full refund) when a later step fails.

While the server runs, a meter (one task per hub process; :mod:`hub_ext.credits.meter`)
debits each further interval when it begins.  Amounts, interval numbers and
Idempotency-Keys come from :mod:`hub_ext.credits.metering`: a key names the server run and
the interval, so a retry or a hub restart never charges twice and never skips an interval.
The meter's books for a server live in ``spawner.hook_state["credits"]``, which the spawner
keeps in its (versioned) spawner state and hands back through :meth:`restore` after a
restart.

- A metering debit refused for lack of credits starts a grace period
  (``c.CreditsHook.grace_period``); then the server is stopped the way JupyterHub's own
  stop handler does it (:func:`hub_ext.spawn.stopping.stop_server`) and the member reads why on
  the hub's home page (:mod:`hub_ext.common.notices`, topic ``credits``).
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
from datetime import UTC, datetime
from typing import Any

from tornado import web
from traitlets import Bool, Callable, Float, Instance, default, validate
from traitlets.config import SingletonConfigurable

from ..common import metrics
from ..common.clock import utcnow
from ..common.notices import notices
from ..spawn.hooks import PENDING, Hook
from .account import remember_balance
from .affordability import UNREACHABLE, Affordability, _money, too_little
from .client import CreditsClient
from .errors import AccountNotFound, CreditsAuthError, CreditsError, InsufficientCredits
from .meter import CreditsMeter, MeteredRun, written_ahead
from .metering import MeterRecord, as_decimal
from .unsettled import Owed, UnsettledStore
from .voids import UNCERTAIN as _UNCERTAIN
from .voids import Void

__all__ = ["CreditsHook", "course_cannot_pay", "too_little", "utcnow"]


def course_cannot_pay(course: str, balance: str, amount) -> str:
    """What a member reads when the course's account cannot pay the first interval."""
    return (
        f"{course}'s account cannot pay for this server: it has {balance} credits and "
        f'the first interval costs {amount}. Tick "Pay with my own '
        'credits" on the card to start it on your own balance, or ask your instructor.'
    )


class CreditsHook(CreditsMeter, Affordability, Hook, SingletonConfigurable):
    """Debits credits for servers: the first interval at spawn, then each interval it runs.

    All spawner-facing methods take the spawner (a :class:`hub_ext.spawn.core.SpawnerCore`
    of either backend, or anything with ``user``, ``name``, ``credits_per_hour``, ``profile_slug``,
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

            c.CreditsHook.utcnow = hub_ext.common.clock.utcnow
        """,
    )

    course_payer = Callable(
        None,
        allow_none=True,
        config=True,
        help="""Who pays instead of the member (the course budget): a function
        ``(spawner, started) -> payer or None``; ``started`` False asks before any GPU is
        taken (may a course pay?), True at the debit (does it, for the GPUs held?).  A
        payer has ``slug``, ``display_name``, ``account``, ``until`` (aware UTC: the
        intervals beginning before it are the course's) and ``until_text()`` (how the
        member reads it, "16:00 UTC", dated on another day).  Set from GPUHUB_COURSES by
        hub_ext.courses.hubconfig (hub_ext.reservations.budget); None: members pay.

            c.CreditsHook.course_payer = hub_ext.reservations.budget.CourseBudget(courses)
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
        self._metered: dict[str, MeteredRun] = {}
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
            username,
            server_name,
            getattr(spawner, "profile_slug", "") or "",
            self.now(),
            price,
            self.interval,
        )
        if spawner.kernel:  # a GPU kernel: the ledger names it and its notebook
            record.kernel = str(spawner.kernel.get("id", ""))
            record.notebook = str(spawner.kernel.get("notebook") or "")
        if spawner.job:  # a notebook job: the ledger names it as the member's list does
            orm_spawner = getattr(spawner, "orm_spawner", None)
            record.job = getattr(orm_spawner, "display_name", None) or "Notebook job"
        payer = self.paying_course(spawner)
        if payer is not None:
            record.course, record.course_account = payer.slug, payer.account
            record.paid_until = payer.until
            spawner.emit(
                25,
                f"Paid by {payer.display_name} during its reservation until {payer.until_text()}",
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
            entry = await self._debit_first(spawner, record, payer)
        except BaseException:
            spawner.hook_state.pop(self.name, None)
            raise
        if entry is None:  # fail_open: started unpaid, tracked by the meter
            return
        record.debits[0] = entry.transaction_id
        self._track(spawner, record)
        if record.course_pays(0):
            spawner.emit(40, f"Debited {record.amount} credits from {payer.display_name}'s account")
            return
        spawner.emit(40, f"Debited {record.amount} credits; your balance is {entry.balance}")
        await remember_balance(spawner.user, entry.balance, self.log)

    def paying_course(self, spawner):
        """The course that pays for this start (``c.CreditsHook.course_payer``), or None:
        the member pays.  Decided once per start, kept in the record."""
        if self.course_payer is None:
            return None
        return self.course_payer(spawner, True)

    def who_pays(self, spawner, credits_per_hour: float) -> tuple[str, bool]:
        """The card's payer: the course during its window (the member may tick "Pay with my
        own credits" for when its account cannot pay), else the member."""
        if as_decimal(credits_per_hour) <= 0:
            return "", False
        payer = self.course_may_pay(spawner)
        if payer is None:
            return "Paid by you", False
        return (
            f"Paid by {payer.display_name} during its reservation until {payer.until_text()}",
            True,
        )

    def course_may_pay(self, spawner):
        """A course that may pay for this member's start now (``c.CreditsHook.course_payer``
        asked before any GPU is taken): the member's balance is then not asked first (the
        course's debit decides; a member who chose to pay themselves is asked there)."""
        if self.course_payer is None:
            return None
        return self.course_payer(spawner, False)

    async def _debit_first(self, spawner, record: MeterRecord, payer=None):
        """The spawn's debit of interval 0: the ledger entry, or None when the API is down
        and ``fail_open`` lets the server start unpaid.  Raises the refusals of
        :meth:`before_container`.  When the course's account cannot pay, the member pays
        only if they chose so (``user_options["pay"] = "self"``); else 402 saying so."""
        if payer is not None:
            try:
                async with asyncio.timeout(self.spawn_timeout):
                    return await self._debit(record, 0)
            except (InsufficientCredits, AccountNotFound) as e:
                balance = _money(getattr(e, "balance", None))
                self.log.warning(
                    "%s's account %s cannot pay interval 0 of %s (%s)",
                    payer.slug,
                    payer.account,
                    record.label,
                    e,
                )
                if not getattr(spawner, "pay_self", False):
                    metrics.SPAWNS_REFUSED.labels(reason="insufficient_credits").inc()
                    raise web.HTTPError(
                        402, course_cannot_pay(payer.display_name, balance, record.amount)
                    ) from None
                record.course = record.course_account = record.paid_until = None
                spawner.emit(
                    30, f"{payer.display_name}'s account cannot pay; you pay, as you chose"
                )
            except asyncio.CancelledError:
                self._void_later(spawner, record, "was stopped before it started")
                raise
            except (CreditsError, TimeoutError):
                pass  # the member's own path below says what a member reads
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
            self.log.warning(
                "Refusing spawn of %s: %s credits for interval 0 refused (%s)",
                record.label,
                record.amount,
                e,
            )
            raise web.HTTPError(402, too_little(price, balance)) from None
        except (CreditsError, TimeoutError) as e:
            why = "timed out" if isinstance(e, TimeoutError) else str(e)
            if isinstance(e, CreditsAuthError):
                self.log.error(
                    "Credits API refused the hub's token (check "
                    "c.CreditsClient.token / GPUHUB_CREDITS_TOKEN): %s",
                    e,
                )
            if self.fail_open and isinstance(e, (*_UNCERTAIN, CreditsAuthError)):
                self.log.warning(
                    "Credits API unavailable for the spawn of %s (%s); starting "
                    "it unpaid (fail_open), the meter charges it later",
                    record.label,
                    why,
                )
                spawner.emit(
                    35,
                    "The credit service cannot be reached; starting anyway, "
                    "the debit follows when it answers",
                )
                self._track(spawner, record)
                return None
            if isinstance(e, _UNCERTAIN):
                self._void_later(spawner, record, "was refused")
            metrics.SPAWNS_REFUSED.labels(reason="credits_unavailable").inc()
            self.log.error(
                "Refusing spawn of %s: the debit of %s credits failed: %s",
                record.label,
                record.amount,
                why,
            )
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
            self.log.warning(
                "%s: the hub stopped during its start, after the debit began; "
                "its container decides (running: metered, else refunded)",
                getattr(spawner, "_log_name", spawner),
            )
            try:
                record = MeterRecord.from_state(written_ahead(state))
            except ValueError as e:
                self.log.error("Cannot restore an unfinished start: %s", e)
                return
            self._unfinished[record.server_id] = (state, spawner)
            self.ensure_meter()
            return
        try:
            record = MeterRecord.from_state(state)
        except ValueError as e:
            self.log.error(
                "Cannot restore the credits metering of %s: %s",
                getattr(spawner, "_log_name", spawner),
                e,
            )
            return
        known = self._metered.get(record.server_id)
        if known is not None:
            for index, debit_id in known.record.debits.items():
                record.debits.setdefault(index, debit_id)
        self._track(spawner, record)
        self.log.info(
            "Metering of %s restored: started %s, %s credits per %gs, intervals %s paid",
            record.label,
            record.started_at.isoformat(),
            record.amount,
            record.interval,
            sorted(record.debits) or "none",
        )
