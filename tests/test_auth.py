"""Login with the organisation's OIDC provider, membership from groups, credits in auth_state.

The hub tests run everything for real: JupyterHub and its proxy, ``oidc-provider-mock`` on
127.0.0.1 (tests/fixtures/oidc.py), the reference credits service managed by the hub, and
the authorization-code flow done by an httpx client that follows the redirects the way a
browser does.  The hubs of the harness let ``gpu-members`` log in and make ``hub-admins``
admins.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jupyterhub.utils import random_port

from hub_ext.credits.client import CreditsClient
from hub_ext.credits.errors import AccountNotFound
from hub_ext.credits.hubconfig import ADMIN_TOKEN_FILE
from hub_ext.login import oidc
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import (
    ADMIN_CONTACT,
    ADMINS,
    MEMBERS,
    authorize,
    begin_login,
    oidc_login,
)


def real_hub(test):
    """The tiers of a test that starts a real hub (and Docker containers)."""
    return pytest.mark.docker(pytest.mark.hub(test))


PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
    {"display_name": "ML 101", "slug": "ml101", "allowed_groups": ["ml101"]},
]

# answers in about a second when the Credits API is down
FAST_CREDITS = (
    "c.CreditsClient.timeout = 1\n"
    "c.CreditsClient.max_attempts = 2\n"
    "c.CreditsClient.backoff_base = 0.05\n"
)


@pytest.fixture
def profiles(tmp_path) -> str:
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps(PROFILES))
    return str(path)


@pytest.fixture
def hub(hub_factory, profiles):
    """A hub with credits on (its managed reference service) and 10 initial credits."""

    async def make(extra_config: str = "", **env):
        return await hub_factory(
            extra_config=extra_config, GPUHUB_PROFILES=profiles, GPUHUB_INITIAL_CREDITS="10", **env
        )

    return make


def browser(hub) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=hub.url, timeout=30)
    hub._clients.append(client)  # closed with the hub
    return client


def ledger_client(hub) -> CreditsClient:
    """An admin client of the hub's managed credits service."""
    port = hub.env["GPUHUB_CREDITS_PORT"]
    token = (hub.state_dir / ADMIN_TOKEN_FILE).read_text().strip()
    return CreditsClient(url=f"http://127.0.0.1:{port}/services/credits/", token=token)


async def ledger(hub, user) -> list[tuple[str, str]]:
    """(kind, amount) of every entry of ``user``'s account, oldest first."""
    async with ledger_client(hub) as client:
        return [(t.kind, str(t.amount)) async for t in client.iter_transactions(user)][::-1]


async def auth_state(hub, user) -> dict:
    r = await hub.api("GET", f"/users/{user}")
    assert r.status_code == 200, r.text
    return r.json()["auth_state"]


async def is_logged_in(client: httpx.AsyncClient) -> bool:
    r = await client.get("/hub/home", follow_redirects=False)
    return r.status_code == 200


def balance_shown(html: str) -> str:
    match = re.search(r'class="gpuhub-balance">([^<]*)<', html)
    assert match, "no credit balance on the page"
    return match.group(1).strip()


def assert_no_secrets(hub, *secrets: str) -> None:
    """No token, code or client secret in the hub's log (nor any JWT at all)."""
    log = hub.log()
    assert log, "the hub wrote no log"
    for secret in (*secrets, hub.env["GPUHUB_OIDC_CLIENT_SECRET"]):
        if secret:
            assert secret not in log, "a secret is in the hub log"
    assert "eyJ" not in log, "something JWT-shaped is in the hub log"


# -- pure parts, no hub -----------------------------------------------------------------------


def _signed(claims: dict, key=None, alg="RS256") -> tuple[str, list]:
    key = key or rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return jwt.encode(claims, key, algorithm=alg), oidc.signing_keys({"keys": [jwk]})


GOOD = {"iss": "https://idp.example", "aud": "hub", "sub": "u1"}


def test_a_valid_id_token_gives_its_claims():
    now = int(time.time())
    token, keys = _signed({**GOOD, "iat": now, "exp": now + 60, "groups": ["a"]})
    claims = oidc.verify_id_token(token, keys, issuer="https://idp.example", client_id="hub")
    assert claims["groups"] == ["a"]


@pytest.mark.parametrize(
    "change, why",
    [
        pytest.param({"aud": "another-client"}, "not meant for client", id="wrong-aud"),
        pytest.param(
            {"iss": "https://evil.example"}, "issued by 'https://evil.example'", id="wrong-iss"
        ),
        pytest.param({"exp": -600}, "expired", id="expired"),
        pytest.param({"iat": 3600, "exp": 7200}, "future", id="issued-in-the-future"),
        pytest.param({"aud": ["hub", "other"]}, "several audiences", id="no-azp"),
    ],
)
def test_id_token_checks_refuse(change, why):
    now = int(time.time())
    claims = {**GOOD, "iat": now, "exp": now + 60}
    claims.update({k: now + v if k in ("exp", "iat") else v for k, v in change.items()})
    token, keys = _signed(claims)
    with pytest.raises(oidc.IDTokenRejected, match=why) as refused:
        oidc.verify_id_token(token, keys, issuer="https://idp.example", client_id="hub")
    assert token not in str(refused.value)


def test_id_token_signed_by_another_key_or_with_a_shared_secret_is_refused():
    now = int(time.time())
    claims = {**GOOD, "iat": now, "exp": now + 60}
    _, keys = _signed(claims)
    forged, _ = _signed(claims)  # another key pair
    with pytest.raises(oidc.UnknownSigningKey):
        oidc.verify_id_token(forged, keys, issuer="https://idp.example", client_id="hub")
    hs = jwt.encode(claims, "client-secret-as-hmac-key-32-bytes!", algorithm="HS256")
    with pytest.raises(oidc.IDTokenRejected, match="algorithm 'HS256'"):
        oidc.verify_id_token(hs, keys, issuer="https://idp.example", client_id="hub")
    unsigned = jwt.encode(claims, None, algorithm="none")
    with pytest.raises(oidc.IDTokenRejected, match="algorithm 'none'"):
        oidc.verify_id_token(unsigned, keys, issuer="https://idp.example", client_id="hub")


def test_discovery_document_of_another_issuer_is_refused():
    doc = {
        "issuer": "https://evil.example",
        "authorization_endpoint": "https://evil.example/a",
        "token_endpoint": "https://evil.example/t",
        "jwks_uri": "https://evil.example/k",
    }
    with pytest.raises(ValueError, match="must be exactly the provider's issuer"):
        oidc.provider_metadata(doc, "https://idp.example")
    assert oidc.provider_metadata(
        {**doc, "issuer": "https://idp.example"}, "https://idp.example"
    ).token_endpoint.endswith("/t")


@pytest.mark.parametrize(
    "supported, configured, method",
    [
        pytest.param(None, "", "client_secret_basic", id="field-absent-means-basic"),
        pytest.param(
            ["client_secret_post", "client_secret_basic"], "", "client_secret_basic", id="both"
        ),
        pytest.param(["client_secret_post"], "", "client_secret_post", id="only-post"),
        pytest.param(["client_secret_basic"], "", "client_secret_basic", id="only-basic"),
        pytest.param(None, "client_secret_post", "client_secret_post", id="setting-wins"),
    ],
)
def test_token_auth_method_comes_from_the_discovery_document(supported, configured, method):
    assert oidc.token_auth_method(supported, configured) == method


def test_a_provider_without_client_secret_methods_is_named():
    with pytest.raises(ValueError, match="lists private_key_jwt"):
        oidc.token_auth_method(("private_key_jwt",))
    doc = {
        "issuer": "https://idp.example",
        "authorization_endpoint": "https://idp.example/a",
        "token_endpoint": "https://idp.example/t",
        "jwks_uri": "https://idp.example/k",
    }
    assert oidc.provider_metadata(doc, "https://idp.example").token_endpoint_auth_methods is None
    listed = {**doc, "token_endpoint_auth_methods_supported": ["client_secret_post"]}
    assert oidc.provider_metadata(listed, "https://idp.example").token_endpoint_auth_methods == (
        "client_secret_post",
    )


# -- the hub's own client credentials ---------------------------------------------------------


async def login_at_registered_client(hub_factory, profiles, oidc_provider, method, **env):
    """alice logs in at a hub whose client is registered at the provider, which then takes
    its secret only sent as ``method`` (and only that secret); ``env`` may change what the
    hub sends.  Returns the hub, alice's browser and the hub's answer to the callback."""
    hub = await hub_factory(start=False, GPUHUB_PROFILES=profiles)
    client_id, secret = oidc_provider.register_client(f"{hub.url}/hub/oauth_callback", method)
    hub.env.update({"GPUHUB_OIDC_CLIENT_ID": client_id, "GPUHUB_OIDC_CLIENT_SECRET": secret, **env})
    await hub.start()
    oidc_provider.member("alice")
    client = browser(hub)
    return hub, client, await oidc_login(client, hub.url, "alice")


@real_hub
@pytest.mark.parametrize(
    "method, env",
    [
        # the provider's discovery lists no token_endpoint_auth_methods_supported: OpenID
        # Connect's default, client_secret_basic, is what it takes
        pytest.param("client_secret_basic", {}, id="basic-by-default"),
        pytest.param(
            "client_secret_post",
            {"GPUHUB_OIDC_TOKEN_AUTH": "client_secret_post"},
            id="post-when-set",
        ),
    ],
)
async def test_login_works_with_a_provider_that_enforces_its_client_auth_method(
    hub_factory, profiles, oidc_provider, method, env
):
    hub, client, r = await login_at_registered_client(
        hub_factory, profiles, oidc_provider, method, **env
    )
    assert r.status_code == 302, r.text[:500]
    assert await is_logged_in(client)
    assert f"({method})" in hub.log()
    assert_no_secrets(hub)


@real_hub
async def test_a_wrong_client_secret_tells_members_sign_in_is_misconfigured(
    hub_factory, profiles, oidc_provider
):
    hub, client, r = await login_at_registered_client(
        hub_factory,
        profiles,
        oidc_provider,
        "client_secret_basic",
        GPUHUB_OIDC_CLIENT_SECRET="not-the-registered-secret",
    )
    assert r.status_code == 503, r.text[:500]
    assert "Sign-in to this hub is misconfigured" in r.text
    assert f'Please tell <strong class="gpuhub-admin-contact">{ADMIN_CONTACT}' in r.text
    assert "already used or has expired" not in r.text and "Traceback" not in r.text
    assert "refused the hub's client credentials (401 invalid_client)" in hub.log()
    assert not await is_logged_in(client)
    assert_no_secrets(hub, "not-the-registered-secret")


# -- members, admins, groups ------------------------------------------------------------------


@real_hub
async def test_member_logs_in_with_groups_and_a_balance(hub):
    hub = await hub()
    client = await hub.login("alice", groups=[MEMBERS, "ml101"])

    model = (await hub.api("GET", "/users/alice")).json()
    assert model["admin"] is False
    assert sorted(model["groups"]) == sorted([MEMBERS, "ml101"])
    r = await hub.api("GET", "/groups/ml101")
    assert r.status_code == 200 and r.json()["users"] == ["alice"]

    state = model["auth_state"]
    assert state["gpuhub"]["groups"] == sorted([MEMBERS, "ml101"])
    assert state["gpuhub"]["credits"]["status"] == "ok"
    assert state["gpuhub"]["credits"]["balance"] == "10.00"
    assert await ledger(hub, "alice") == [("grant", "10.00")]

    home = (await client.get("/hub/home")).text
    assert balance_shown(home) == "10.00 credits"
    spawn = (await client.get("/hub/spawn")).text
    assert balance_shown(spawn) == "10.00 credits"
    assert 'for="profile-ml101"' in spawn  # the profile list uses the synced groups

    # a second login (another browser) never grants twice
    await hub.login("alice", groups=[MEMBERS, "ml101"])
    assert await ledger(hub, "alice") == [("grant", "10.00")]
    assert_no_secrets(hub, state["access_token"], state["refresh_token"], state["id_token"])


@real_hub
async def test_admin_group_member_is_an_admin_and_others_are_not(hub):
    hub = await hub()
    await hub.login("boss", groups=[ADMINS])
    await hub.login("alice", groups=[MEMBERS])
    assert (await hub.api("GET", "/users/boss")).json()["admin"] is True
    assert (await hub.api("GET", "/users/alice")).json()["admin"] is False
    r = await hub.api("GET", f"/groups/{ADMINS}")
    assert r.json()["users"] == ["boss"]

    # leaving the admin group at the provider takes admin away at the next login
    await hub.login("boss", groups=[MEMBERS])
    assert (await hub.api("GET", "/users/boss")).json()["admin"] is False


@real_hub
async def test_non_member_is_refused_with_a_page_saying_why_and_whom_to_ask(hub, oidc_provider):
    hub = await hub()
    oidc_provider.member("mallory", groups=["guests"])
    r = await oidc_login(browser(hub), hub.url, "mallory")
    assert r.status_code == 403
    page = r.text
    assert "Not a member of this hub" in page
    assert "You signed in as mallory" in page and MEMBERS in page
    assert "guests" in page  # what they are in
    assert ADMIN_CONTACT in page  # whom to ask
    assert "Traceback" not in page
    assert (await hub.api("GET", "/users/mallory")).status_code == 404
    async with ledger_client(hub) as credits:
        with pytest.raises(AccountNotFound):  # no credits for people who cannot log in
            await credits.balance("mallory")
    assert_no_secrets(hub)


@real_hub
async def test_refresh_reads_the_balance_again_and_drops_those_who_left(hub, oidc_provider):
    hub = await hub(extra_config="c.CreditAuthenticator.auth_refresh_age = 1\n")
    client = await hub.login("alice", groups=[MEMBERS])
    assert balance_shown((await client.get("/hub/home")).text) == "10.00 credits"

    async with ledger_client(hub) as credits:
        await credits.grant("alice", "5", key="test-top-up-alice-0001")
    await asyncio.sleep(1.2)
    assert balance_shown((await client.get("/hub/home")).text) == "15.00 credits"

    # new groups at the provider reach JupyterHub at the next refresh
    oidc_provider.member("alice", groups=[MEMBERS, "vision"])
    await asyncio.sleep(1.2)
    await client.get("/hub/home")
    assert sorted((await hub.api("GET", "/users/alice")).json()["groups"]) == [MEMBERS, "vision"]

    # out of the allowed groups: the next refresh sends them to log in again
    oidc_provider.member("alice", groups=["vision"])
    await asyncio.sleep(1.2)
    r = await client.get("/hub/home", follow_redirects=False)
    assert r.status_code == 302 and "/hub/login" in r.headers["location"]


# -- refused logins ---------------------------------------------------------------------------


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


def _with_query(url: str, **changes: str) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(query=urlencode({**_query(url), **changes})))


def _forged(callback: str) -> str:
    """The callback with a well-formed ``state`` that no login of this browser started."""
    state = base64.urlsafe_b64encode(json.dumps({"state_id": "0" * 32}).encode()).decode()
    return _with_query(callback, state=state)


@real_hub
async def test_forged_state_is_refused(hub, oidc_provider):
    hub = await hub()
    oidc_provider.member("alice")
    client = browser(hub)
    callback = await authorize(client, await begin_login(client, hub.url), "alice")
    r = await client.get(_forged(callback))
    assert r.status_code == 400 and "OAuth state mismatch" in r.text
    assert not await is_logged_in(client)
    assert (await hub.api("GET", "/users/alice")).status_code == 404
    assert_no_secrets(hub, _query(callback)["code"])


@real_hub
async def test_replayed_code_is_refused(hub, oidc_provider):
    hub = await hub()
    oidc_provider.member("alice")
    victim = browser(hub)
    callback = await authorize(victim, await begin_login(victim, hub.url), "alice")
    assert (await victim.get(callback)).status_code == 302  # the real login

    # the attacker has the callback URL and starts a login of their own for a valid state
    attacker = browser(hub)
    attacker_state = _query(await begin_login(attacker, hub.url))["state"]
    r = await attacker.get(_with_query(callback, state=attacker_state))
    assert r.status_code == 403, r.text[:500]
    assert "did not accept this sign-in" in r.text
    assert not await is_logged_in(attacker)
    assert "token endpoint answered 400" in hub.log()
    assert_no_secrets(hub, _query(callback)["code"])


@real_hub
async def test_token_from_another_issuer_is_refused(hub, oidc_provider, oidc_provider_factory):
    other = oidc_provider_factory()
    other.member("alice")
    hub = await hub(
        # the hub trusts oidc_provider, but is sent through another provider
        GPUHUB_OIDC_AUTHORIZE_URL=f"{other.url}/oauth2/authorize",
        GPUHUB_OIDC_TOKEN_URL=f"{other.url}/oauth2/token",
        GPUHUB_OIDC_USERINFO_URL=f"{other.url}/userinfo",
    )
    client = browser(hub)
    r = await oidc_login(client, hub.url, "alice")
    assert r.status_code == 403, r.text[:500]
    assert "could not be verified" in r.text and "Traceback" not in r.text
    assert f"does not verify with the keys of {oidc_provider.url}" in hub.log()
    assert not await is_logged_in(client)
    assert (await hub.api("GET", "/users/alice")).status_code == 404
    assert_no_secrets(hub)


@real_hub
async def test_wrong_iss_is_refused(hub, oidc_provider):
    # same provider and keys, reached under another name: its tokens then name that issuer
    port = urlparse(oidc_provider.url).port
    hub = await hub(GPUHUB_OIDC_TOKEN_URL=f"http://localhost:{port}/oauth2/token")
    oidc_provider.member("alice")
    client = browser(hub)
    r = await oidc_login(client, hub.url, "alice")
    assert r.status_code == 403, r.text[:500]
    assert f"issued by 'http://localhost:{port}', not by '{oidc_provider.url}'" in hub.log()
    assert not await is_logged_in(client)
    assert_no_secrets(hub)


@real_hub
async def test_expired_id_token_is_refused(hub, oidc_provider_factory):
    stale = oidc_provider_factory("--token-max-age=-600")  # every token expired on issue
    stale.member("alice")
    hub = await hub(oidc=stale)
    client = browser(hub)
    r = await oidc_login(client, hub.url, "alice")
    assert r.status_code == 403, r.text[:500]
    assert "the ID token has expired" in hub.log()
    assert not await is_logged_in(client)
    assert_no_secrets(hub)


# -- the Credits API down ---------------------------------------------------------------------


@real_hub
async def test_login_succeeds_when_the_credit_api_is_down(hub_factory, profiles):
    nowhere = f"http://127.0.0.1:{random_port()}"  # nothing listens there
    hub = await hub_factory(
        extra_config=FAST_CREDITS,
        GPUHUB_PROFILES=profiles,
        GPUHUB_CREDITS_URL=nowhere,
        GPUHUB_CREDITS_TOKEN="hub-token",
        GPUHUB_INITIAL_CREDITS="10",
        GPUHUB_CREDITS_ADMIN_TOKEN="admin-token",
    )
    client = await hub.login("alice")
    assert (await auth_state(hub, "alice"))["gpuhub"]["credits"]["status"] == "unknown"
    assert balance_shown((await client.get("/hub/home")).text) == "unknown"
    assert balance_shown((await client.get("/hub/spawn")).text) == "unknown"

    # spawns stay fail-closed: the priced profile is refused
    r = await hub.browser_api(client, "POST", "/users/alice/server", json={"profile": "gpu"})
    assert r.status_code >= 400, r.text
    assert "credit service cannot be reached" in r.json()["message"]


# -- the admin panel, against the running hub -------------------------------------------------


@real_hub
async def test_admin_adds_and_removes_a_user(hub):
    hub = await hub()
    admin = await hub.login("boss", groups=[ADMINS])
    assert (await admin.get("/hub/admin")).status_code == 200

    r = await hub.browser_api(admin, "POST", "/users/newbie", json={})
    assert r.status_code == 201, r.text
    r = await hub.browser_api(admin, "GET", "/users")
    assert "newbie" in {u["name"] for u in r.json()}

    r = await hub.browser_api(admin, "DELETE", "/users/newbie")
    assert r.status_code == 204, r.text
    assert (await hub.api("GET", "/users/newbie")).status_code == 404


@real_hub
async def test_admin_stops_a_members_server_freeing_the_gpu_and_refunding_credits(
    hub, docker_client
):
    hub = await hub()
    admin = await hub.login("boss", groups=[ADMINS])
    alice = await hub.login("alice")
    r = await hub.browser_api(alice, "POST", "/users/alice/server", json={"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    free = (await hub.api("GET", "/gpuhub/availability")).json()["free"]
    assert free == 1
    assert await ledger(hub, "alice") == [("grant", "10.00"), ("debit", "1.00")]

    r = await hub.browser_api(admin, "DELETE", "/users/alice/server")
    assert r.status_code in (202, 204), r.text

    async def stopped():
        model = (await hub.api("GET", "/users/alice")).json()["servers"].get("")
        return not model

    await eventually(stopped, what="alice's server stopped")
    assert hub.containers(docker_client) == []
    assert (await hub.api("GET", "/gpuhub/availability")).json()["free"] == 2

    async def refunded():
        return [kind for kind, _ in await ledger(hub, "alice")] == ["grant", "debit", "refund"]

    await eventually(refunded, what="a refund in the ledger")
    refund = (await ledger(hub, "alice"))[-1][1]
    assert "0.00" < refund <= "1.00"


@real_hub
async def test_non_admin_gets_403_on_admin_pages_and_admin_api(hub):
    hub = await hub()
    await hub.login("boss", groups=[ADMINS])
    alice = await hub.login("alice")
    r = await hub.browser_api(alice, "GET", "/user")  # her cookie and xsrf work
    assert r.status_code == 200 and r.json()["name"] == "alice"

    assert (await alice.get("/hub/admin", follow_redirects=False)).status_code == 403
    for method, path, body in [
        ("GET", "/users", None),
        ("POST", "/users/eve", {}),
        ("DELETE", "/users/boss", None),
        ("PATCH", "/users/alice", {"admin": True}),
        ("POST", "/groups/ml101", {}),
        ("GET", "/proxy", None),
    ]:
        r = await hub.browser_api(alice, method, path, json=body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    # another member's server: JupyterHub answers 404 so as not to say whether it exists
    for method in ("POST", "DELETE"):
        r = await hub.browser_api(alice, method, "/users/boss/server", json={})
        assert r.status_code == 404 and "No access" in r.json()["message"], r.text

    assert (await hub.api("GET", "/users/alice")).json()["admin"] is False
    assert (await hub.api("GET", "/users/eve")).status_code == 404
    assert (await hub.api("GET", "/users/boss")).json()["servers"] == {}
    assert (await hub.api("GET", "/groups/ml101")).status_code == 404
