"""The demo's OpenID provider, asking for a per-run secret before it hands out an identity.

``scripts/demo.sh`` runs oidc-provider-mock on loopback so that people can sign in as anyone
(admin, alice, ...).  With host networking a member's container shares that loopback, so
code in a terminal could sign in as ``admin`` too.  This module serves the same provider
behind a WSGI guard: every page where an identity is chosen or changed (``/oauth2/authorize``,
``/users/...``, the provider's own pages, Werkzeug's debugger) needs HTTP Basic
credentials whose password is the run's secret, which ``demo.sh`` makes at each start
(mode 0600 in the state dir) and prints on the demo's console.  Only what the hub itself
calls behind the scenes stays open: discovery, the signing keys, the token endpoint (it
needs a code, which only a guarded authorization gives) and userinfo (it needs a token).

    python -m hub_ext.login.demo_provider --port 9400 --secret-file var/demo-login-secret \\
        --user-claims '{"sub": "alice", "groups": ["gpu-members"]}'
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hmac
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

#: Paths the hub calls server-to-server; everything else needs the secret.
OPEN_PATHS = frozenset({"/.well-known/openid-configuration", "/jwks", "/oauth2/token", "/userinfo"})
REALM = "GPU Cluster Hub demo login (any user name; the password is printed by demo.sh)"


class SecretGuard:
    """WSGI middleware: HTTP Basic with the demo's secret as the password, except on
    :data:`OPEN_PATHS` (and never for Werkzeug's debugger, whose requests carry
    ``__debugger__``)."""

    def __init__(self, app, secret: str):
        if len(secret) < 8:
            raise ValueError("the demo login secret must be at least 8 characters")
        self.app = app
        self.secret = secret.encode()

    def allowed(self, environ: dict) -> bool:
        path = environ.get("PATH_INFO", "")
        if path in OPEN_PATHS and "__debugger__" not in environ.get("QUERY_STRING", ""):
            return True
        scheme, _, encoded = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            _, _, password = base64.b64decode(encoded, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(password, self.secret)

    def __call__(self, environ, start_response):
        if self.allowed(environ):
            return self.app(environ, start_response)
        body = (
            b"The demo's sign-in page needs the password printed on the demo's console "
            b"(scripts/demo.sh).\n"
        )
        start_response(
            "401 Unauthorized",
            [
                ("WWW-Authenticate", f'Basic realm="{REALM}"'),
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
            ],
        )
        return [body]


def read_secret(path: Path) -> str:
    """The secret in ``path``; ValueError when others may read it or it is too short."""
    if path.stat().st_mode & 0o077:
        raise ValueError(f"{path} holds the demo login secret: make it mode 0600")
    return path.read_text().strip()


def build_app(secret: str, user_claims: list[dict]):
    """oidc-provider-mock's app with ``user_claims`` (each with a ``sub``), guarded."""
    from oidc_provider_mock import app
    from oidc_provider_mock._storage import User

    users = [
        User(sub=c["sub"], claims={k: v for k, v in c.items() if k != "sub"}) for c in user_claims
    ]
    return SecretGuard(app(user_claims=users, access_token_max_age=timedelta(hours=1)), secret)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hub_ext.login.demo_provider", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--user-claims", action="append", default=[], type=json.loads)
    args = parser.parse_args(argv)
    try:
        secret = read_secret(args.secret_file)
        wsgi = build_app(secret, args.user_claims)
    except (OSError, ValueError) as e:
        print(f"demo provider: {e}", file=sys.stderr)
        return 2
    os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"  # http on loopback, a demo
    import uvicorn

    uvicorn.run(wsgi, interface="wsgi", host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
