"""``gpuhub config check --reach`` for the login: does the OpenID provider answer, and does it
accept the hub's client credentials?

The provider's discovery document is fetched and read as the hub reads it
(:func:`hub_ext.login.oidc.provider_metadata`), and the client secret is tried the way the
hub sends it (:func:`hub_ext.login.oidc.token_auth_method`): a made-up authorization code
goes to the token endpoint.  The provider then answers 400 ``invalid_grant`` when it
accepted the client's id and secret (the code alone is wrong), and ``invalid_client`` (401,
or 400) when it did not (RFC 6749 §5.2).  No member is involved and nothing is issued.
Docs: reference/settings ("See and check the settings"), how-to/identity-provider.
"""

from __future__ import annotations

import secrets

import httpx

from ..backends import reason
from . import oidc

#: where the made-up code says it was sent, when GPUHUB_OIDC_CALLBACK_URL is not set
PLACEHOLDER_CALLBACK = "https://gpuhub-config-check.invalid/hub/oauth_callback"


def check_provider(settings, timeout: float) -> list[str]:
    """One sentence per problem with the provider (``GPUHUB_OIDC_*`` named), an ``ok:``
    line printed for each part that is good.  Never raises."""
    url = oidc.discovery_url(settings.oidc_issuer)
    try:
        r = httpx.get(url, timeout=timeout)
        r.raise_for_status()
        metadata = oidc.provider_metadata(r.json(), settings.oidc_issuer)
        method = oidc.token_auth_method(
            metadata.token_endpoint_auth_methods, settings.oidc_token_auth
        )
    except (httpx.HTTPError, ValueError) as e:
        return [f"GPUHUB_OIDC_ISSUER: {url}: {reason(e)}"]
    print(f"ok: the OIDC provider's discovery document ({url})")
    return check_client(
        settings, settings.oidc_token_url or metadata.token_endpoint, method, timeout
    )


def check_client(settings, token_url: str, method: str, timeout: float) -> list[str]:
    """Send a made-up code to ``token_url`` with the hub's client id and secret, sent as
    ``method``; a problem when the provider refuses the client."""
    data = {
        "grant_type": "authorization_code",
        "code": "gpuhub-config-check-" + secrets.token_hex(8),
        "redirect_uri": settings.oidc_callback_url or PLACEHOLDER_CALLBACK,
    }
    auth = None
    if method == oidc.CLIENT_SECRET_BASIC:
        auth = (settings.oidc_client_id, settings.oidc_client_secret)
    else:
        data.update(client_id=settings.oidc_client_id, client_secret=settings.oidc_client_secret)
    try:
        r = httpx.post(token_url, data=data, auth=auth, timeout=timeout)
    except httpx.HTTPError as e:
        return [f"GPUHUB_OIDC_TOKEN_URL: {token_url}: {reason(e)}"]
    error = oidc.token_error(r.content)
    answer = f"{r.status_code} {error or '(no error code)'}"
    if r.status_code == 401 or error in ("invalid_client", "unauthorized_client"):
        return [
            "GPUHUB_OIDC_CLIENT_SECRET: the provider's token endpoint refused the hub's client "
            f"id {settings.oidc_client_id!r} and its secret ({answer}, sent as {method}): "
            "check GPUHUB_OIDC_CLIENT_ID, GPUHUB_OIDC_CLIENT_SECRET and GPUHUB_OIDC_TOKEN_AUTH "
            "against the provider's registration of the hub"
        ]
    if error == "invalid_grant":
        print(f"ok: the OIDC provider accepts the hub's client id and secret ({method})")
    else:
        print(
            f"note: the OIDC provider answered {answer} to a made-up code: it cannot tell "
            "whether the hub's client secret is right"
        )
    return []
