"""OpenID Connect pieces the authenticator needs, as pure functions: no HTTP, no hub.

- :func:`provider_metadata` reads a provider's discovery document
  (``<issuer>/.well-known/openid-configuration``, OpenID Connect Discovery 1.0 §3) and
  checks that it describes the issuer it was fetched for (§4.3);
- :func:`token_auth_method` picks how the hub authenticates at the token endpoint from
  that document's ``token_endpoint_auth_methods_supported``;
- :func:`token_error` reads the ``error`` code of a refused token request (RFC 6749 §5.2).
- :func:`verify_id_token` checks an ID token the way OpenID Connect Core 1.0 §3.1.3.7
  asks: signature by a key the issuer publishes (its JWKS, asymmetric algorithms only),
  ``iss`` identical to the configured issuer, ``aud`` containing the client id (and
  ``azp`` when there are several audiences), ``exp``/``iat`` within a small leeway, and a
  ``sub``.

A refused token raises :class:`IDTokenRejected`, whose message says *why* for the
operator's log and never contains the token itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlparse

import jwt

__all__ = [
    "ASYMMETRIC_ALGORITHMS",
    "IDTokenRejected",
    "ProviderMetadata",
    "UnknownSigningKey",
    "discovery_url",
    "provider_metadata",
    "signing_keys",
    "token_auth_method",
    "token_error",
    "verify_id_token",
]

#: How a client with a secret authenticates at the token endpoint (OpenID Connect Core 1.0
#: §9): the secret in an HTTP Basic header, or in the POST body.
CLIENT_SECRET_BASIC = "client_secret_basic"
CLIENT_SECRET_POST = "client_secret_post"
TOKEN_AUTH_METHODS = (CLIENT_SECRET_BASIC, CLIENT_SECRET_POST)

#: Algorithms an ID token may be signed with.  Never ``none`` and never HS*: a shared
#: secret would let anyone holding the client secret mint tokens.
ASYMMETRIC_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)

#: Claims about the token itself, not about the member; dropped when claims are merged.
TOKEN_CLAIMS = frozenset(
    {
        "iss",
        "aud",
        "exp",
        "iat",
        "nbf",
        "jti",
        "azp",
        "nonce",
        "auth_time",
        "at_hash",
        "c_hash",
        "s_hash",
        "acr",
        "amr",
        "sid",
    }
)


class IDTokenRejected(Exception):
    """An ID token that must not log anyone in; ``str()`` is safe to log (no token)."""


class UnknownSigningKey(IDTokenRejected):
    """Signed by a key the issuer's JWKS does not hold (rotated, or another issuer)."""


@dataclass(frozen=True)
class ProviderMetadata:
    """The endpoints of one OpenID provider (Discovery 1.0 §3 field names)."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str = ""
    end_session_endpoint: str = ""
    #: ``token_endpoint_auth_methods_supported``; None when the document has no such field
    token_endpoint_auth_methods: tuple[str, ...] | None = None


def discovery_url(issuer: str) -> str:
    """Where ``issuer`` publishes its discovery document (Discovery 1.0 §4)."""
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def provider_metadata(document: object, issuer: str) -> ProviderMetadata:
    """The endpoints in a discovery ``document`` fetched for ``issuer``.

    Raises ValueError when the document is not an object, names another issuer (§4.3: they
    must be identical, so a document cannot redirect logins elsewhere) or lacks one of
    ``authorization_endpoint``, ``token_endpoint`` and ``jwks_uri``.
    """
    if not isinstance(document, dict):
        raise ValueError("the discovery document is not a JSON object")
    if document.get("issuer") != issuer:
        raise ValueError(
            f"the discovery document names issuer {document.get('issuer')!r}, not {issuer!r}; "
            "GPUHUB_OIDC_ISSUER must be exactly the provider's issuer URL"
        )
    missing = [
        k
        for k in ("authorization_endpoint", "token_endpoint", "jwks_uri")
        if not isinstance(document.get(k), str) or not document[k]
    ]
    if missing:
        raise ValueError(f"the discovery document has no {', '.join(missing)}")
    return ProviderMetadata(
        issuer=issuer,
        authorization_endpoint=document["authorization_endpoint"],
        token_endpoint=document["token_endpoint"],
        jwks_uri=document["jwks_uri"],
        userinfo_endpoint=document.get("userinfo_endpoint") or "",
        end_session_endpoint=document.get("end_session_endpoint") or "",
        token_endpoint_auth_methods=_methods(document.get("token_endpoint_auth_methods_supported")),
    )


def _methods(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(
            "the discovery document's token_endpoint_auth_methods_supported is not a list"
        )
    return tuple(m for m in value if isinstance(m, str))


def token_auth_method(supported: tuple[str, ...] | None, configured: str = "") -> str:
    """How the hub sends its client secret to the token endpoint: ``configured`` when set
    (``GPUHUB_OIDC_TOKEN_AUTH``), else from the provider's
    ``token_endpoint_auth_methods_supported`` (``supported``; None when its discovery
    document has no such field, or was not read).

    ``client_secret_basic`` when listed or when the field is absent (Discovery 1.0 §3: "If
    omitted, the default is client_secret_basic"), ``client_secret_post`` when only that
    one is listed.  Raises ValueError when the provider lists neither (a client secret
    cannot sign in there: private_key_jwt and the like are not supported).
    """
    if configured:
        return configured
    if supported is None or CLIENT_SECRET_BASIC in supported:
        return CLIENT_SECRET_BASIC
    if CLIENT_SECRET_POST in supported:
        return CLIENT_SECRET_POST
    raise ValueError(
        "the provider's token endpoint takes neither client_secret_basic nor "
        f"client_secret_post (it lists {', '.join(supported) or 'none'}); register the hub "
        "as a confidential client with a client secret"
    )


def token_error(body: bytes | str | None) -> str:
    """The ``error`` code of a token endpoint's refusal (RFC 6749 §5.2: ``invalid_grant``,
    ``invalid_client``, ...), or ``""`` when its body is not such a JSON object."""
    try:
        document = json.loads(body or b"")
    except (ValueError, UnicodeDecodeError):
        return ""
    error = document.get("error") if isinstance(document, dict) else None
    return error if isinstance(error, str) else ""


def signing_keys(jwks: object) -> list[jwt.PyJWK]:
    """The usable signature keys of a JWKS document (RFC 7517); others are skipped.

    Raises ValueError when the document holds no usable key at all.
    """
    if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
        raise ValueError("the JWKS document has no `keys` list")
    keys = []
    for data in jwks["keys"]:
        if not isinstance(data, dict) or data.get("use", "sig") != "sig":
            continue
        try:
            keys.append(jwt.PyJWK.from_dict(data))
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue
    if not keys:
        raise ValueError("the JWKS document holds no usable signing key")
    return keys


def _candidates(header: dict, keys: list[jwt.PyJWK]) -> list[jwt.PyJWK]:
    kid = header.get("kid")
    if kid is not None:
        return [k for k in keys if k.key_id == kid]
    # no kid (allowed by RFC 7515): any key of the matching type may be the one
    alg = header.get("alg", "")
    kty = "OKP" if alg == "EdDSA" else {"R": "RSA", "P": "RSA", "E": "EC"}.get(alg[:1], "")
    return [k for k in keys if k.key_type == kty]


def verify_id_token(
    id_token: str,
    keys: list[jwt.PyJWK],
    *,
    issuer: str,
    client_id: str,
    leeway: float = 30.0,
) -> dict:
    """The claims of ``id_token`` once it passed every check of Core 1.0 §3.1.3.7.

    ``keys`` are the issuer's signing keys (:func:`signing_keys`); ``leeway`` is the clock
    skew allowed, in seconds.  Raises :class:`UnknownSigningKey` when no key of ``keys``
    can have signed it (the caller may refresh the JWKS once and retry) and
    :class:`IDTokenRejected` for everything else: bad signature, wrong ``iss``, ``aud`` or
    ``azp``, expired, issued in the future, no ``sub``, or a forbidden algorithm.
    """
    try:
        header = jwt.get_unverified_header(id_token)
    except jwt.DecodeError:
        raise IDTokenRejected("the ID token is not a signed JWT") from None
    alg = header.get("alg")
    if alg not in ASYMMETRIC_ALGORITHMS:
        raise IDTokenRejected(
            f"the ID token uses algorithm {alg!r}; only "
            f"{', '.join(ASYMMETRIC_ALGORITHMS)} are accepted"
        )
    candidates = _candidates(header, keys)
    if not candidates:
        raise UnknownSigningKey(
            f"the ID token is signed by key {header.get('kid')!r}, which the issuer "
            f"{issuer} does not publish"
        )
    problem: IDTokenRejected | None = None
    for key in candidates:
        try:
            claims = jwt.decode(
                id_token,
                key=key.key,
                algorithms=[alg],
                audience=client_id,
                issuer=issuer,
                leeway=leeway,
                options={"require": ["iss", "sub", "aud", "exp", "iat"]},
            )
        except jwt.InvalidSignatureError:
            problem = UnknownSigningKey(
                f"the ID token's signature does not verify with the keys of {issuer}"
            )
            continue
        except jwt.ExpiredSignatureError:
            raise IDTokenRejected("the ID token has expired (exp is in the past)") from None
        except jwt.InvalidIssuerError:
            raise IDTokenRejected(
                f"the ID token was issued by {_issuer_of(id_token)!r}, not by {issuer!r}"
            ) from None
        except jwt.InvalidAudienceError:
            raise IDTokenRejected(
                f"the ID token is not meant for client {client_id!r} (aud)"
            ) from None
        except (jwt.ImmatureSignatureError, jwt.InvalidIssuedAtError):
            raise IDTokenRejected("the ID token is issued in the future (iat/nbf)") from None
        except jwt.MissingRequiredClaimError as e:
            raise IDTokenRejected(f"the ID token has no {e.claim!r} claim") from None
        except jwt.PyJWTError as e:
            raise IDTokenRejected(f"the ID token is invalid ({type(e).__name__})") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != client_id:
            raise IDTokenRejected(
                f"the ID token has several audiences and azp {claims.get('azp')!r}, "
                f"not {client_id!r}"
            )
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise IDTokenRejected("the ID token's sub is empty")
        return claims
    assert problem is not None
    raise problem


def unverified_claims(id_token: str) -> dict:
    """The payload of an ID token this process verified earlier (kept in auth_state)."""
    return jwt.decode(id_token, options={"verify_signature": False})


def member_claims(id_claims: dict, userinfo: dict) -> dict:
    """The member's claims: the ID token's, then the UserInfo answer's on top (fresher).

    Claims about the token itself (``TOKEN_CLAIMS``) are dropped.  Raises
    :class:`IDTokenRejected` when both have a ``sub`` and they differ (Core 1.0 §5.3.2).
    """
    if "sub" in id_claims and "sub" in userinfo and id_claims["sub"] != userinfo["sub"]:
        raise IDTokenRejected("the UserInfo answer is about another subject than the ID token")
    merged = {k: v for k, v in id_claims.items() if k not in TOKEN_CLAIMS}
    merged.update(userinfo)
    return merged


def _issuer_of(id_token: str) -> str:
    try:
        iss = unverified_claims(id_token).get("iss")
    except (jwt.DecodeError, json.JSONDecodeError):
        return "?"
    if not isinstance(iss, str):
        return "?"
    parsed = urlparse(iss)
    # only the origin and path: nothing else of the token reaches the log
    return f"{parsed.scheme}://{parsed.netloc}{parsed.path}" if parsed.netloc else "?"
