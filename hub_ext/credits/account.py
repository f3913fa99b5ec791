"""A member's credit account as the authenticator sees it: read at login and each refresh.

:func:`read_credit_account` asks the Credits API (:class:`~hub_ext.credits.client.CreditsClient`)
for the member's balance and, when the member has no account yet and the site grants
initial credits, creates it with one grant.  The grant's Idempotency-Key comes from the
username (:func:`initial_grant_key`), so logging in twice, two logins at once, or a login
retried after a lost answer never grant twice: the service answers a replay with the
original transaction.

The result is a small JSON-able dict kept in the member's ``auth_state`` under
``auth_state["gpuhub"]["credits"]`` (JupyterHub encrypts auth_state with
``JUPYTERHUB_CRYPT_KEY``)::

    {"status": "ok", "balance": "12.50", "checked_at": "2025-01-01T12:00:00+00:00"}

``status`` is ``ok`` (``balance`` in credits, two places), ``none`` (no account and no
initial grant configured), ``unknown`` (the Credits API did not answer: login goes on; a
spawn stays fail-closed in :class:`~hub_ext.credits.hook.CreditsHook`) or ``off`` (credits
are off on this hub).

:class:`MemberAccount` shows it in the hub's pages: ``c.JupyterHub.template_vars`` entry
``gpuhub_member``, used by ``share/gpuhub/templates/credit_balance.html``.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from decimal import Decimal

from ..common.clock import utcnow
from .amounts import format_amount
from .client import CreditsClient
from .errors import (
    AccountNotFound,
    CreditsAuthError,
    CreditsError,
    IdempotencyConflict,
)

__all__ = [
    "STATE_KEY",
    "MemberAccount",
    "credits_off",
    "initial_grant_key",
    "read_credit_account",
    "remember_balance",
    "unknown",
]

#: The key of this distribution's part of ``auth_state``.
STATE_KEY = "gpuhub"


def initial_grant_key(username: str) -> str:
    """The Idempotency-Key of ``username``'s initial grant: the same for every login."""
    return "gpuhub-initial-grant-" + hashlib.sha256(username.encode()).hexdigest()[:40]


def _state(status: str, balance: Decimal | None = None) -> dict:
    return {
        "status": status,
        "balance": format_amount(balance) if balance is not None else None,
        "checked_at": utcnow().isoformat(timespec="seconds"),
    }


def unknown() -> dict:
    """The account state when the Credits API did not answer."""
    return _state("unknown")


def credits_off() -> dict:
    """The account state on a hub with credits off."""
    return _state("off")


async def read_credit_account(
    client: CreditsClient,
    username: str,
    *,
    initial_credits: Decimal | None = None,
    grant_client: CreditsClient | None = None,
    log: logging.Logger,
) -> dict:
    """The state of ``username``'s credit account, for ``auth_state`` (see the module doc).

    ``client`` reads balances (the hub token); ``grant_client`` (an admin token) makes the
    initial grant of ``initial_credits`` when the account does not exist.  Never raises a
    :class:`~hub_ext.credits.errors.CreditsError`: a Credits API that cannot be reached or
    refuses the hub's token gives ``status: unknown`` and a warning in ``log``.  May be
    cancelled (the caller's timeout); a grant cut short is replayed by the next login.
    """
    try:
        try:
            account = await client.balance(username)
        except AccountNotFound:
            if not initial_credits or grant_client is None:
                log.info("Credits: %s has no credit account yet", username)
                return _state("none")
            try:
                grant = await grant_client.grant(
                    username,
                    initial_credits,
                    key=initial_grant_key(username),
                    reason="initial credits",
                    metadata={"source": "gpuhub-login"},
                )
            except IdempotencyConflict:
                # granted before, with another amount (the setting changed since)
                log.info("Credits: %s had an initial grant already", username)
            else:
                if not grant.replayed:
                    log.info(
                        "Credits: granted %s initial credits to %s",
                        format_amount(initial_credits),
                        username,
                    )
                    return _state("ok", grant.balance)
            account = await client.balance(username)
        return _state("ok", account.balance)
    except CreditsAuthError as e:
        log.error(
            "Credits: the Credits API refused the hub's token reading %s's account (%s)",
            username,
            e,
        )
    except CreditsError as e:
        log.warning("Credits: no answer about %s's account (%s); balance unknown", username, e)
    return unknown()


class MemberAccount:
    """``c.JupyterHub.template_vars["gpuhub_member"]``: a member's account in templates.

    JupyterHub renders its pages with Jinja's async mode, which awaits coroutines that a
    template calls, so ``{% set account = gpuhub_member.credits(user) %}`` reads the
    (encrypted) auth_state of ``user`` (a JupyterHub ``User``).  Not callable on purpose:
    JupyterHub would call a callable template var with the user itself.

    An account read more than ``max_age`` seconds ago is read again through the hub's
    authenticator (its ``credit_account``) and saved, so a grant made outside the hub shows
    within a minute, not only at the next login refresh.
    """

    def __init__(self, max_age: float = 60.0):
        self.max_age = max_age

    async def credits(self, user) -> dict:
        """``status`` and ``balance`` (a string of credits, or None) of ``user``."""
        if user is None or not hasattr(user, "get_auth_state"):
            return {"status": "off", "balance": None}
        try:
            auth_state = await user.get_auth_state()
        except Exception:  # noqa: BLE001 - a page must render even with a rotated key
            logging.getLogger(__name__).warning("auth_state of %s cannot be read", user.name)
            auth_state = None
        ours = (auth_state or {}).get(STATE_KEY)
        account = (ours or {}).get("credits")
        if not isinstance(account, dict):
            return {"status": "unknown", "balance": None}
        reader = getattr(getattr(user, "authenticator", None), "credit_account", None)
        if reader is not None and account.get("status") != "off" and self._stale(account):
            account = await reader(user.name)
            ours["credits"] = account
            await user.save_auth_state(auth_state)
        return {"status": account.get("status", "unknown"), "balance": account.get("balance")}

    def _stale(self, account: dict) -> bool:
        try:
            checked_at = datetime.fromisoformat(account["checked_at"])
        except (KeyError, TypeError, ValueError):
            return True
        return (utcnow() - checked_at).total_seconds() > self.max_age


async def remember_balance(user, balance: Decimal, log: logging.Logger) -> None:
    """Keep in ``user``'s auth_state the balance the Credits API just answered a debit or
    refund with, so the hub's pages show it at once.  Never raises."""
    if not hasattr(user, "save_auth_state"):
        return
    try:
        auth_state = await user.get_auth_state()
        if not auth_state or not isinstance(auth_state.get(STATE_KEY), dict):
            return
        auth_state[STATE_KEY]["credits"] = _state("ok", balance)
        await user.save_auth_state(auth_state)
    except Exception as e:  # noqa: BLE001 - only a display; the ledger is the truth
        log.warning("Could not keep the new balance of %s in auth_state: %s", user.name, e)
