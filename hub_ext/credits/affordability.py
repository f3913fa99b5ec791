"""Can a member pay for a profile? Asked before any GPU is reserved, and by the spawn page.

:class:`Affordability` is the part of :class:`hub_ext.credits.hook.CreditsHook` that reads
a balance and compares it with the first interval of a profile's ``credits_per_hour``
(:func:`hub_ext.credits.metering.interval_amount`): :meth:`Affordability.before_reserve`
refuses a spawn the member cannot pay (402) or whose balance cannot be read (503), and
:meth:`Affordability.why_not` gives the spawn page the same sentence for a disabled
profile.  It uses the hook's traits (``client``, ``interval``, ``spawn_timeout``,
``fail_open``) and its ``log``.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

from tornado import web

from ..common import metrics
from .account import MemberAccount
from .errors import AccountNotFound, CreditsError
from .metering import CENT, as_decimal, interval_amount

__all__ = ["UNREACHABLE", "Affordability", "too_little"]

UNREACHABLE = (
    "The credit service cannot be reached, so no server or job on a paid profile can start "
    "now. Try again in a few minutes."
)


def _money(value: Decimal | None) -> str:
    return f"{(value or Decimal(0)).quantize(CENT)}"


def too_little(price: Decimal, balance: Decimal | None) -> str:
    """The sentence a member reads when their balance cannot pay a profile."""
    return (
        f"This profile costs {_money(price)} credits per hour; your balance is "
        f"{_money(balance)}. Pick a free profile, or ask an admin for credits."
    )


class Affordability:
    """Balance checks of :class:`hub_ext.credits.hook.CreditsHook` (a mixin: it reads the
    hook's ``client``, ``interval``, ``spawn_timeout``, ``fail_open`` and ``log``)."""

    async def before_reserve(self, spawner) -> None:
        """Refuse, before any GPU is reserved, a priced start the member cannot pay.

        Reads the balance from the Credits API (not a cached one; within ``spawn_timeout``)
        and compares it with the first interval at the profile's ``credits_per_hour``.
        Raises ``HTTPError(402)`` with the sentence of the debit's refusal when it is lower
        or there is no account, and ``HTTPError(503)`` when the API cannot be reached
        (with ``fail_open``: no refusal, the debit decides as it always did).  The debit
        in :meth:`before_container` stays the authority: a balance spent in between is
        refused there.  A free profile makes no API call.
        """
        price = as_decimal(spawner.credits_per_hour)
        if price <= 0 or self.course_may_pay(spawner):
            return  # the course's debit decides (CreditsHook.before_container)
        who = getattr(spawner, "_log_name", spawner.user.name)
        try:
            async with asyncio.timeout(self.spawn_timeout):  # a stop is never swallowed
                account = await self.client.balance(spawner.user.name)
            balance = account.balance
        except AccountNotFound:
            balance = None
        except (CreditsError, TimeoutError) as e:
            why = "timed out" if isinstance(e, TimeoutError) else str(e)
            if self.fail_open:
                self.log.warning(
                    "Credits API unavailable checking the balance of %s (%s); "
                    "the debit decides (fail_open)",
                    who,
                    why,
                )
                return
            metrics.SPAWNS_REFUSED.labels(reason="credits_unavailable").inc()
            self.log.error("Refusing spawn of %s: its balance cannot be read: %s", who, why)
            raise web.HTTPError(503, UNREACHABLE) from None
        refusal = self._cannot_pay(price, balance)
        if refusal:
            metrics.SPAWNS_REFUSED.labels(reason="insufficient_credits").inc()
            self.log.warning(
                "Refusing spawn of %s before reserving anything: balance %s is "
                "below the first interval",
                who,
                _money(balance),
            )
            raise web.HTTPError(402, refusal)

    def course_may_pay(self, spawner):
        """A course that may pay for this start (then the member's balance is not asked
        before the GPU is taken), or None.  Default: none; the hook decides."""
        return None

    def _cannot_pay(self, price: Decimal, balance: Decimal | None) -> str:
        """The sentence of :func:`too_little` when ``balance`` (None: no account) is below
        the first interval at ``price`` credits per hour, else ``""``."""
        if balance is not None and balance >= interval_amount(price, self.interval):
            return ""
        return too_little(price, balance)

    async def why_not(self, spawner, credits_per_hour: float) -> str:
        """Why a profile of this price cannot start for this member now, or ``""``.

        Only a balance known to be too low for the first interval is a reason: the spawn
        page disables the profile and shows the sentence of the spawn-time refusal.  An
        unknown balance is no reason here (the spawn itself decides, failing closed).
        """
        price = as_decimal(credits_per_hour)
        if price <= 0 or self.course_may_pay(spawner):
            return ""
        account = await MemberAccount().credits(spawner.user)
        if account["status"] != "ok" or account["balance"] is None:
            return ""
        return self._cannot_pay(price, Decimal(account["balance"]))
