"""CreditAuthenticator: members log in with the organisation's OpenID Connect provider.

A thin subclass of OAuthenticator's :class:`~oauthenticator.generic.GenericOAuthenticator`
(version 17).  The base class owns the flow (``authenticate()`` is not overridden: state
cookie, PKCE, code exchange, UserInfo, managed groups, allowed/admin groups); this class
sets OIDC defaults and overrides small steps:

- endpoints come from the issuer's discovery document, fetched when first needed
  (:meth:`hub_ext.login.provider.ProviderClient.discover`), unless configured explicitly;
- :meth:`~CreditAuthenticator.get_token_info` verifies the ID token when it arrives
  (:func:`hub_ext.login.oidc.verify_id_token`: signature by the issuer's JWKS, ``iss``, ``aud``,
  ``exp``); a replayed or foreign code, a token from another issuer or an expired one is a
  403 page, with the reason in the log and never a token;
- :meth:`~CreditAuthenticator.update_auth_model` puts the member's groups and credit account
  (:mod:`hub_ext.credits.account`: balance read, initial grant made once) into ``auth_state``,
  at login and at every refresh (``auth_refresh_age``, ``refresh_pre_spawn``);
- :meth:`~CreditAuthenticator.check_allowed` refuses a non-member with a page that says why
  and whom to ask (403, :class:`LoginRefused`, template ``login_refused.html``);
- :meth:`~CreditAuthenticator.refresh_user` logs out a member who left the allowed groups,
  and keeps members logged in while the provider is briefly unreachable;
- its handlers carry the spawn gate (:mod:`hub_ext.spawn.gate`): JupyterHub lists an
  authenticator's handlers ahead of its own, the one documented place where a route of
  JupyterHub's can get a check before JupyterHub's handler runs.

Configured by :func:`hub_ext.login.hubconfig.apply_auth_config` from ``GPUHUB_OIDC_*`` settings.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

from markupsafe import Markup
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthCallbackHandler, OAuthLoginHandler
from tornado import web
from tornado.httpclient import HTTPClientError
from traitlets import Bool, Float, Unicode, default, validate

from ..common.templates import render
from ..credits.account import STATE_KEY, credits_off, read_credit_account, unknown
from ..credits.amounts import format_amount
from ..credits.client import CreditsClient
from ..spawn.gate import GatedRoutes
from . import oidc
from .provider import (
    CODE_REFUSED,
    MISCONFIGURED,
    SERVICE_DOWN,
    TOKEN_REFUSED,
    ProviderClient,
    client_refused,
    why,
)

__all__ = ["CreditAuthenticator", "LoginRefused"]


class LoginRefused(web.HTTPError):
    """403 (or ``status``) whose page says why and whom to ask; ``log_message`` is the
    operator's detail.

    JupyterHub's error page shows ``jupyterhub_html_message`` (rendered here from the
    autoescaped template ``login_refused.html``) instead of the log message.
    """

    def __init__(
        self,
        log_message: str,
        *,
        title: str,
        why: str,
        contact: str = "",
        groups: list[str] | None = None,
        status: int = 403,
        ask: str = "To get access, ask",
    ):
        super().__init__(status, log_message, reason=title)
        self.jupyterhub_html_message = Markup(
            render("login_refused.html", why=why, contact=contact, groups=groups, ask=ask)
        )


class _NoQueryInLogs:
    """Tornado logs refused requests with their URI; the callback's query holds the code."""

    def _request_summary(self) -> str:
        return f"{self.request.method} {self.request.path} ({self.request.remote_ip})"


class LoginHandler(_NoQueryInLogs, OAuthLoginHandler):
    """``/hub/oauth_login``: discover the provider's endpoints first, then redirect."""

    async def get(self):
        await self.authenticator.discover()
        super().get()


class CallbackHandler(_NoQueryInLogs, OAuthCallbackHandler):
    """``/hub/oauth_callback``: OAuthenticator's, with the query kept out of the log."""


class CreditAuthenticator(GatedRoutes, ProviderClient, GenericOAuthenticator):
    """The organisation's OIDC login; groups decide membership and admins; credits ride along.

    Needs ``issuer`` and ``client_id`` (raises ValueError at start-up without them) and
    ``JUPYTERHUB_CRYPT_KEY`` (auth_state is on; JupyterHub refuses to start without a key).
    """

    login_handler = LoginHandler
    callback_handler = CallbackHandler

    issuer = Unicode(
        config=True,
        help="""The provider's issuer URL, exactly as its ID tokens name it (``iss``).

        Endpoints not set explicitly come from ``<issuer>/.well-known/openid-configuration``.

            c.CreditAuthenticator.issuer = "https://login.example.org/realms/club"
        """,
    )

    jwks_url = Unicode(
        config=True,
        help="""Where the issuer publishes its signing keys (JWKS); default: discovered.

            c.CreditAuthenticator.jwks_url = "https://login.example.org/realms/club/certs"
        """,
    )

    admin_contact = Unicode(
        config=True,
        help="""Whom a refused person should ask for access, shown on the refusal page.

            c.CreditAuthenticator.admin_contact = "hub-admins@example.org"
        """,
    )

    token_auth_method = Unicode(
        "",
        config=True,
        help="""How the hub sends its client secret to the token endpoint:
        ``client_secret_basic`` (an HTTP Basic header) or ``client_secret_post`` (in the
        POST body).  Empty: from the provider's discovery document (Basic when it lists it
        or lists nothing, Post when it lists only that; OpenID Connect Discovery 1.0 §3).

            c.CreditAuthenticator.token_auth_method = "client_secret_post"
        """,
    )

    id_token_leeway = Float(
        30.0,
        config=True,
        help="""Seconds of clock skew allowed when checking an ID token's ``exp`` and ``iat``.

            c.CreditAuthenticator.id_token_leeway = 30
        """,
    )

    discovery_timeout = Float(
        10.0,
        config=True,
        help="""Seconds to wait for the discovery document and the JWKS.

            c.CreditAuthenticator.discovery_timeout = 10
        """,
    )

    credits_enabled = Bool(
        False,
        config=True,
        help="""Read each member's credit account at login and refresh (``CreditsClient``).

            c.CreditAuthenticator.credits_enabled = True
        """,
    )

    initial_credits = Unicode(
        "",
        config=True,
        help="""Credits granted once to a member who logs in without an account ("" or 0: none).

        Needs ``credits_admin_token``.  The grant's Idempotency-Key comes from the username.

            c.CreditAuthenticator.initial_credits = "10"
        """,
    )

    credits_admin_token = Unicode(
        "",
        config=True,
        help="""Credits API admin token, used only for the initial grant; never logged.

            c.CreditAuthenticator.credits_admin_token = open(".../credits-admin-token").read()
        """,
    )

    credits_timeout = Float(
        5.0,
        config=True,
        help="""Seconds a login or refresh waits for the Credits API before it shows the
        balance as unknown (and goes on).

            c.CreditAuthenticator.credits_timeout = 5
        """,
    )

    uid_claim = Unicode(
        "",
        config=True,
        help="""Claim holding the member's own uid (e.g. LDAP's ``uidNumber``), so their
        server runs as them and files on shared storage are theirs; "" runs everyone as
        jovyan (uid 1000) unless the Docker backend's ``uid_map_file`` maps them.

            c.CreditAuthenticator.uid_claim = "uidNumber"
        """,
    )

    gid_claim = Unicode(
        "",
        config=True,
        help="""Claim holding the member's primary gid (e.g. ``gidNumber``); "" uses the
        uid as the gid.

            c.CreditAuthenticator.gid_claim = "gidNumber"
        """,
    )

    @default("login_service")
    def _login_service_default(self) -> str:
        return "your organisation account"

    @default("scope")
    def _scope_default(self) -> list[str]:
        return ["openid", "profile", "email"]

    @default("username_claim")
    def _username_claim_default(self) -> str:
        return "preferred_username"

    @default("manage_groups")
    def _manage_groups_default(self) -> bool:
        return True

    @default("enable_auth_state")
    def _enable_auth_state_default(self) -> bool:
        return True

    @default("auth_state_groups_key")
    def _auth_state_groups_key_default(self) -> str:
        return f"{self.user_auth_state_key}.groups"

    @default("custom_403_message")
    def _custom_403_message_default(self) -> str:
        return "You cannot log in to this hub." + (
            f" Ask {self.admin_contact} for access." if self.admin_contact else ""
        )

    @validate("issuer", "jwks_url")
    def _validate_url(self, proposal) -> str:
        value = proposal["value"].strip()
        if value and not value.startswith(("https://", "http://")):
            raise ValueError(
                f"c.CreditAuthenticator.{proposal['trait'].name} must be an http(s) URL, "
                f"e.g. 'https://login.example.org/realms/club', not {value!r}"
            )
        return value

    @validate("token_auth_method")
    def _validate_token_auth_method(self, proposal) -> str:
        value = proposal["value"].strip()
        if value and value not in oidc.TOKEN_AUTH_METHODS:
            raise ValueError(
                "c.CreditAuthenticator.token_auth_method must be "
                f"{' or '.join(map(repr, oidc.TOKEN_AUTH_METHODS))} or '' (from the provider's "
                f"discovery document), not {value!r}"
            )
        return value

    @validate("initial_credits")
    def _validate_initial_credits(self, proposal) -> str:
        value = proposal["value"].strip()
        if not value:
            return ""
        try:
            return format_amount(value)
        except ValueError:
            raise ValueError(
                "c.CreditAuthenticator.initial_credits must be an amount of credits with at "
                f"most two decimal places, e.g. '10' or '2.50', not {value!r}"
            ) from None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if not self.issuer:
            raise ValueError(
                "CreditAuthenticator needs the provider's issuer URL: set GPUHUB_OIDC_ISSUER "
                "(c.CreditAuthenticator.issuer)"
            )
        if not self.client_id:
            raise ValueError(
                "CreditAuthenticator needs the client id registered with the provider: set "
                "GPUHUB_OIDC_CLIENT_ID (c.CreditAuthenticator.client_id)"
            )
        self._discovery_lock = asyncio.Lock()
        self._discovered = False
        self._keys: list | None = None
        self._keys_fetched = 0.0
        self._credits: CreditsClient | None = None
        self._grants: CreditsClient | None = None

    # -- the small steps of OAuthenticator's flow ---------------------------------------

    async def get_token_info(self, handler, params):
        """The token endpoint's answer, its ID token verified (required at login).

        A refused code (replayed, expired, issued to another client) is a 403 page; a
        provider that refuses the hub's own credentials (``invalid_client``) a 503 page that
        says sign-in is misconfigured and whom to tell; a provider that does not answer a
        503 page.
        """
        await self.discover()
        try:
            token_info = await super().get_token_info(handler, params)
        except HTTPClientError as e:
            if e.response is not None and client_refused(e):
                self.log.error(
                    "OIDC: the token endpoint refused the hub's client credentials (%s %s): "
                    "check GPUHUB_OIDC_CLIENT_ID, GPUHUB_OIDC_CLIENT_SECRET and "
                    "GPUHUB_OIDC_TOKEN_AUTH (sent as %s)",
                    e.code,
                    oidc.token_error(e.response.body) or "no error code",
                    "client_secret_basic" if self.basic_auth else "client_secret_post",
                )
                raise LoginRefused(
                    "OIDC: the provider refused the hub's client credentials",
                    title="Sign-in is misconfigured",
                    why=MISCONFIGURED,
                    contact=self.admin_contact,
                    status=503,
                    ask="Please tell",
                ) from None
            if 400 <= e.code < 500:
                self.log.warning(
                    "OIDC login refused: the token endpoint answered %s to the %s grant",
                    e.code,
                    params.get("grant_type"),
                )
                raise web.HTTPError(403, CODE_REFUSED) from None
            self.log.error("OIDC: the token endpoint did not answer (%s)", why(e))
            raise web.HTTPError(503, SERVICE_DOWN) from None
        except OSError as e:
            self.log.error("OIDC: the token endpoint cannot be reached (%s)", why(e))
            raise web.HTTPError(503, SERVICE_DOWN) from None
        id_token = token_info.get("id_token")
        if id_token:
            await self.verify_id_token(id_token)
        elif params.get("grant_type") != "refresh_token":
            # a refresh answer may omit it (OIDC Core 12.2); a login may not
            self.log.warning(
                "OIDC login refused: the token endpoint sent no ID token; "
                "is 'openid' in c.CreditAuthenticator.scope?"
            )
            raise web.HTTPError(403, TOKEN_REFUSED)
        return token_info

    async def token_to_user(self, token_info):
        """The member's claims: the (verified) ID token's, then UserInfo's on top."""
        id_token = token_info.get("id_token")
        id_claims = oidc.unverified_claims(id_token) if id_token else {}
        userinfo = {}
        if self.userdata_url:
            userinfo = await super().token_to_user(token_info)
        try:
            return oidc.member_claims(id_claims, userinfo or {})
        except oidc.IDTokenRejected as e:
            self.log.warning("OIDC login refused: %s", e)
            raise web.HTTPError(403, TOKEN_REFUSED) from None

    def user_info_to_username(self, user_info):
        """The ``username_claim`` of the member's claims; a 403 page when it is missing."""
        claim = self.username_claim
        name = claim(user_info) if callable(claim) else user_info.get(claim)
        if not name or not isinstance(name, str):
            raise LoginRefused(
                f"OIDC login refused: no {claim!r} claim for subject {user_info.get('sub')!r}",
                title="No user name",
                why=(
                    "Your account at the login service has no user name this hub can use. "
                    "Ask for your account to be completed."
                ),
                contact=self.admin_contact,
            )
        return name

    async def update_auth_model(self, auth_model):
        """Add the member's groups, credit account and (with ``uid_claim``) uid and gid to
        ``auth_state["gpuhub"]``.

        Called by OAuthenticator at login and at every refresh.  The Credits API is asked
        only about people who may log in; its failures never fail the login.
        """
        name = auth_model["name"]
        auth_state = auth_model["auth_state"]
        groups = set(await self.get_user_groups(auth_state)) if self.manage_groups else set()
        admin = bool(auth_model["admin"]) or bool(groups & self.admin_groups)
        ours = {"groups": sorted(groups)}
        claims = auth_state.get(self.user_auth_state_key) or {}
        for key, claim in (("uid", self.uid_claim), ("gid", self.gid_claim)):
            if claim and claims.get(claim) is not None:
                ours[key] = claims[claim]  # checked by the spawner (never root)
        if self.may_log_in(name, groups, admin):
            ours["credits"] = await self.credit_account(name)
        auth_state[STATE_KEY] = ours
        return auth_model

    def may_log_in(self, username: str, groups: set[str], admin: bool) -> bool:
        """The membership rule: admins, allowed users, and members of allowed/admin groups."""
        if self.allow_all or admin or username in self.allowed_users:
            return True
        return bool(groups & (self.allowed_groups | self.admin_groups))

    async def check_allowed(self, username, auth_model):
        """OAuthenticator's rule; a refusal is a page saying why and whom to ask."""
        if await super().check_allowed(username, auth_model):
            return True
        groups = sorted(auth_model.get("groups") or []) if auth_model else []
        needed = sorted(self.allowed_groups | self.admin_groups)
        raise LoginRefused(
            f"OIDC login refused: {username} is in groups {groups}, none of {needed}",
            title="Not a member of this hub",
            why=(
                f"You signed in as {username}, but this hub is open only to members of "
                f"{_either(needed)}."
            ),
            groups=groups,
            contact=self.admin_contact,
        )

    async def refresh_user(self, user, handler=None, **kwargs):
        """OAuthenticator's refresh (new groups, admin, credits), plus two rules.

        A member no longer in an allowed group must log in again (and is refused).  While
        the provider does not answer (5xx, timeout), members stay logged in and only their
        credit account is read again.
        """
        try:
            refreshed = await super().refresh_user(user, handler, **kwargs)
        except HTTPClientError as e:
            if 400 <= e.code < 500:
                raise
            self.log.warning(
                "Refreshing %s: the login service did not answer (%s); keeping their login",
                user.name,
                why(e),
            )
            return await self._refresh_credits_only(user)
        except OSError as e:
            self.log.warning(
                "Refreshing %s: the login service cannot be reached (%s); keeping their login",
                user.name,
                why(e),
            )
            return await self._refresh_credits_only(user)
        if isinstance(refreshed, dict):
            groups = set(refreshed.get("groups") or [])
            if not self.may_log_in(refreshed["name"], groups, bool(refreshed.get("admin"))):
                self.log.warning(
                    "%s is no longer in an allowed group (has %s); they must log in again",
                    user.name,
                    sorted(groups),
                )
                return False
        return refreshed

    async def _refresh_credits_only(self, user):
        auth_state = await user.get_auth_state()
        if not auth_state or STATE_KEY not in auth_state:
            return True
        ours = auth_state[STATE_KEY]
        ours["credits"] = await self.credit_account(user.name)
        return {"name": user.name, "auth_state": auth_state, "groups": ours.get("groups")}

    # -- credits -----------------------------------------------------------------------

    async def credit_account(self, username: str) -> dict:
        """The member's credit account for auth_state (:mod:`hub_ext.credits.account`)."""
        if not self.credits_enabled:
            return credits_off()
        if self._credits is None:
            self._credits = CreditsClient(parent=self)
            if self.initial_credits and Decimal(self.initial_credits) > 0:
                if self.credits_admin_token:
                    self._grants = CreditsClient(parent=self, token=self.credits_admin_token)
                else:
                    self.log.error(
                        "initial_credits is set but credits_admin_token is empty; no initial grants"
                    )
        try:
            return await asyncio.wait_for(
                read_credit_account(
                    self._credits,
                    username,
                    initial_credits=Decimal(self.initial_credits or "0"),
                    grant_client=self._grants,
                    log=self.log,
                ),
                self.credits_timeout,
            )
        except TimeoutError:
            self.log.warning(
                "Credits: no answer about %s's account in %ss; balance unknown",
                username,
                self.credits_timeout,
            )
            return unknown()


def _either(groups: list[str]) -> str:
    if not groups:
        return "groups this hub has not named yet"
    if len(groups) == 1:
        return f"the group {groups[0]}"
    return "the groups " + ", ".join(groups[:-1]) + f" or {groups[-1]}"
