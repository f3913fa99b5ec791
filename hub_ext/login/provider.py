"""The authenticator's calls to the organisation's OpenID Connect provider.

:class:`ProviderClient` is mixed into
:class:`hub_ext.login.authenticator.CreditAuthenticator` (it reads that class's traits:
``issuer``, the endpoints, ``client_id``, ``id_token_leeway``, ``discovery_timeout``): the
discovery document, fetched once when first needed (OpenID Connect Discovery 1.0), the
issuer's signing keys (JWKS, fetched again when a token names a key we do not have: the
provider rotated them), and the ID token check of
:func:`hub_ext.login.oidc.verify_id_token`. A provider that cannot be reached is a 503 page
in plain words (:data:`SERVICE_DOWN`); a token that does not verify a 403
(:data:`TOKEN_REFUSED`), with the reason in the log and never the token.
"""

from __future__ import annotations

import time

from tornado import web
from tornado.httpclient import HTTPClientError

from . import oidc

__all__ = [
    "CODE_REFUSED",
    "MISCONFIGURED",
    "SERVICE_DOWN",
    "TOKEN_REFUSED",
    "ProviderClient",
    "client_refused",
    "why",
]

SERVICE_DOWN = (
    "The organisation's login service cannot be reached right now, so nobody can log in. "
    "Try again in a few minutes."
)
CODE_REFUSED = (
    "The login service did not accept this sign-in (it was already used or has expired). "
    "Please log in again."
)
TOKEN_REFUSED = (
    "The sign-in could not be verified (it did not come from the organisation's login "
    "service, or it has expired). Please log in again."
)
#: the sign-in page when the provider refuses the hub's own client credentials: nothing the
#: member can retry, so whom to tell
MISCONFIGURED = (
    "Sign-in to this hub is misconfigured: the organisation's login service does not accept "
    "the hub's own credentials, so nobody can log in until the hub's operators fix it."
)


def client_refused(error: HTTPClientError) -> bool:
    """Whether the token endpoint refused the hub itself (its client id, secret or
    authentication method: ``invalid_client``, RFC 6749 §5.2, answered with 401 or 400), not
    the code or the member."""
    body = error.response.body if error.response is not None else b""
    return error.code == 401 or oidc.token_error(body) in ("invalid_client", "unauthorized_client")


def why(error: BaseException) -> str:
    """A short reason for the log: the class and the code, never a request or a body."""
    code = getattr(error, "code", None)
    return f"{type(error).__name__} {code}" if code else type(error).__name__


class ProviderClient:
    """Discovery, signing keys and ID token checks of the hub's OIDC provider."""

    async def discover(self) -> None:
        """Fill the endpoints not configured from the issuer's discovery document, once,
        and choose how the client secret goes to the token endpoint
        (:func:`hub_ext.login.oidc.token_auth_method`).

        Raises ``web.HTTPError(503)`` while the provider cannot be reached (tried again at
        the next login) and ``web.HTTPError(500)`` when its document is not for ``issuer``.
        """
        if self._discovered:
            return
        async with self._discovery_lock:
            if self._discovered:
                return
            if not (self.authorize_url and self.token_url and self.jwks_url):
                url = oidc.discovery_url(self.issuer)
                document = await self._get_json(url, "fetching the OIDC discovery document")
                try:
                    metadata = oidc.provider_metadata(document, self.issuer)
                except ValueError as e:
                    self.log.error("OIDC discovery %s: %s", url, e)
                    raise web.HTTPError(
                        500,
                        "The login service is misconfigured; the hub's operators have the details.",
                    ) from None
                try:
                    method = oidc.token_auth_method(
                        metadata.token_endpoint_auth_methods, self.token_auth_method
                    )
                except ValueError as e:
                    self.log.error("OIDC discovery %s: %s", url, e)
                    raise web.HTTPError(500, MISCONFIGURED) from None
                self.authorize_url = self.authorize_url or metadata.authorization_endpoint
                self.token_url = self.token_url or metadata.token_endpoint
                self.jwks_url = self.jwks_url or metadata.jwks_uri
                if not self.userdata_url and not self.userdata_from_id_token:
                    self.userdata_url = metadata.userinfo_endpoint
            else:  # every endpoint configured: no document, OpenID Connect's default
                method = oidc.token_auth_method(None, self.token_auth_method)
            # OAuthenticator sends the secret in a Basic header with basic_auth, else in
            # the POST body
            self.basic_auth = method == oidc.CLIENT_SECRET_BASIC
            self.log.info(
                "OIDC provider %s: authorize %s, token %s (%s), keys %s",
                self.issuer,
                self.authorize_url,
                self.token_url,
                method,
                self.jwks_url,
            )
            self._discovered = True

    async def _get_json(self, url: str, label: str):
        try:
            return await self.httpfetch(
                url,
                label,
                method="GET",
                headers={"Accept": "application/json"},
                validate_cert=self.validate_server_cert,
                request_timeout=self.discovery_timeout,
                connect_timeout=self.discovery_timeout,
            )
        except (HTTPClientError, OSError, ValueError) as e:
            self.log.error("OIDC: %s failed (%s)", label, why(e))
            raise web.HTTPError(503, SERVICE_DOWN) from None

    async def _signing_keys(self, refresh: bool = False) -> list:
        """The issuer's signing keys, fetched once and again when a token names a new one."""
        stale = refresh and time.monotonic() - self._keys_fetched > 10
        if self._keys is None or stale:
            document = await self._get_json(self.jwks_url, "fetching the issuer's signing keys")
            try:
                self._keys = oidc.signing_keys(document)
            except ValueError as e:
                self.log.error("OIDC keys %s: %s", self.jwks_url, e)
                raise web.HTTPError(503, SERVICE_DOWN) from None
            self._keys_fetched = time.monotonic()
        return self._keys

    async def verify_id_token(self, id_token: str) -> dict:
        """The claims of a newly received ID token, or a 403 :class:`web.HTTPError`."""
        try:
            try:
                keys = await self._signing_keys()
                return oidc.verify_id_token(
                    id_token,
                    keys,
                    issuer=self.issuer,
                    client_id=self.client_id,
                    leeway=self.id_token_leeway,
                )
            except oidc.UnknownSigningKey:
                # the provider may have rotated its keys since we fetched them
                keys = await self._signing_keys(refresh=True)
                return oidc.verify_id_token(
                    id_token,
                    keys,
                    issuer=self.issuer,
                    client_id=self.client_id,
                    leeway=self.id_token_leeway,
                )
        except oidc.IDTokenRejected as e:
            self.log.warning("OIDC login refused: %s", e)
            raise web.HTTPError(403, TOKEN_REFUSED) from None
