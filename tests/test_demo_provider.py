"""The demo provider's guard (hub_ext/login/demo_provider.py): an identity only for the person
with the run's secret; the hub's back-channel calls stay open."""

from __future__ import annotations

import base64

import pytest

from hub_ext.login.demo_provider import SecretGuard, read_secret

SECRET = "s3cret-of-this-run"


def call(path: str, password: str | None = None, query: str = "") -> str:
    def provider(environ, start_response):
        start_response("200 OK", [])
        return [b"provider"]

    environ = {"PATH_INFO": path, "QUERY_STRING": query}
    if password is not None:
        token = base64.b64encode(f"anyone:{password}".encode()).decode()
        environ["HTTP_AUTHORIZATION"] = f"Basic {token}"
    statuses = []
    SecretGuard(provider, SECRET)(environ, lambda status, headers: statuses.append(status))
    return statuses[0]


@pytest.mark.parametrize(
    "path",
    [
        "/oauth2/authorize",
        "/users/admin",
        "/",
        "/oidc/login",
        "/users/admin/revoke-tokens",
        "/oauth2/end_session",
    ],
)
def test_choosing_or_changing_an_identity_needs_the_secret(path):
    assert call(path) == "401 Unauthorized"
    assert call(path, "wrong") == "401 Unauthorized"
    assert call(path, SECRET) == "200 OK"


@pytest.mark.parametrize(
    "path", ["/.well-known/openid-configuration", "/jwks", "/oauth2/token", "/userinfo"]
)
def test_the_hubs_back_channel_calls_stay_open(path):
    assert call(path) == "200 OK"


def test_werkzeugs_debugger_is_never_open():
    assert call("/jwks", query="__debugger__=yes&cmd=resource") == "401 Unauthorized"


def test_the_secret_file_must_be_private(tmp_path):
    path = tmp_path / "demo-login-secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o644)
    with pytest.raises(ValueError, match="mode 0600"):
        read_secret(path)
    path.chmod(0o600)
    assert read_secret(path) == SECRET
    with pytest.raises(ValueError, match="at least 8"):
        SecretGuard(lambda e, s: [], "short")
