"""How the hub logs people in: ``apply_auth_config(c, settings)``.

Always :class:`hub_ext.login.authenticator.CreditAuthenticator` (the organisation's OpenID Connect
provider), configured from the ``GPUHUB_OIDC_*``, ``GPUHUB_*_GROUPS``, ``GPUHUB_ADMIN_CONTACT``
and ``GPUHUB_INITIAL_CREDITS`` settings of :class:`hub_ext.config.Settings`.  A hub without
``GPUHUB_OIDC_ISSUER`` and ``GPUHUB_OIDC_CLIENT_ID`` refuses to start, naming them.

The initial grant needs an admin token of the Credits API: the managed reference service's
``credits-admin-token`` file in the state directory, or ``GPUHUB_CREDITS_ADMIN_TOKEN`` with
an external ``GPUHUB_CREDITS_URL``.

``GPUHUB_DEMO_LOGIN=1`` marks the demo (docs/tutorial/first-hub.md), whose local provider
(oidc-provider-mock) lets anyone pick any identity: it only runs on a loopback address.
"""

from __future__ import annotations

from pathlib import Path

AUTHENTICATOR = "hub_ext.login.authenticator.CreditAuthenticator"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def split_list(value: str) -> list[str]:
    """``"a, b c"`` -> ``["a", "b", "c"]``: commas or spaces separate items."""
    return [item for item in value.replace(",", " ").split() if item]


def apply_auth_config(c, settings) -> None:
    """Set the authenticator from ``settings``.

    Raises ValueError for a setting that cannot work: the demo login off loopback, or an
    initial grant without an admin token for an external Credits API.
    """
    if settings.demo_login and settings.ip not in LOOPBACK:
        raise ValueError(
            "GPUHUB_DEMO_LOGIN=1 lets anyone pick any identity at the demo's OIDC provider and "
            f"only runs on loopback; GPUHUB_IP is {settings.ip!r}"
        )
    c.JupyterHub.authenticator_class = AUTHENTICATOR
    a = c.CreditAuthenticator
    for trait, value in (
        ("issuer", settings.oidc_issuer),
        ("client_id", settings.oidc_client_id),
        ("client_secret", settings.oidc_client_secret),
        ("token_auth_method", settings.oidc_token_auth),
        ("authorize_url", settings.oidc_authorize_url),
        ("token_url", settings.oidc_token_url),
        ("userdata_url", settings.oidc_userinfo_url),
        ("jwks_url", settings.oidc_jwks_url),
        ("oauth_callback_url", settings.oidc_callback_url),
        ("username_claim", settings.oidc_username_claim),
        ("uid_claim", settings.oidc_uid_claim),
        ("gid_claim", settings.oidc_gid_claim),
        ("admin_contact", settings.admin_contact),
    ):
        if value:
            a[trait] = value
    if settings.oidc_scopes:
        a.scope = split_list(settings.oidc_scopes)
    if settings.oidc_groups_claim:
        a.auth_state_groups_key = f"oauth_user.{settings.oidc_groups_claim}"
    a.allowed_groups = set(split_list(settings.allowed_groups))
    a.admin_groups = set(split_list(settings.admin_groups))
    if settings.demo_login:
        a.login_service = "the demo login (pick any identity; not for production)"

    a.credits_enabled = settings.credits
    if not settings.credits:
        return
    if settings.initial_credits:
        a.initial_credits = settings.initial_credits
        a.credits_admin_token = _admin_token(settings)

    from ..credits.account import MemberAccount

    template_vars = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    template_vars["gpuhub_member"] = MemberAccount()
    template_vars["gpuhub_admin_contact"] = settings.admin_contact
    c.JupyterHub.template_vars = template_vars


def _admin_token(settings) -> str:
    if settings.credits_url:
        if not settings.credits_admin_token:
            raise ValueError(
                "GPUHUB_INITIAL_CREDITS with GPUHUB_CREDITS_URL needs GPUHUB_CREDITS_ADMIN_TOKEN "
                "(the initial grant is an admin operation of the Credits API)"
            )
        return settings.credits_admin_token
    from ..common.services import token_file
    from ..credits.hubconfig import ADMIN_TOKEN_FILE

    return token_file(Path(settings.state_dir) / ADMIN_TOKEN_FILE)
