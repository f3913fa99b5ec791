"""The early refusal (hub_ext/spawn/gate.py, ``EarlyRefusal``) in a real hub: a member's
own browser session starting their own server, which the spawner refuses now, is answered
from ``prepare()`` with what JupyterHub's own path answers; every other request gets
JupyterHub's own answer.

Which path answered shows in the hub's log (DEBUG in tests): the early refusal logs
"Refused <name>'s start before JupyterHub's request handling".  JupyterHub's own answer
to the same start comes from a request it handles itself: the member's API token
(JupyterHub tries a token first, and the early path never takes one).
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.oidc import ADMINS, MEMBERS

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "PyTorch", "slug": "gpu", "gpus": 1},
]
REFUSAL = "No GPU free: all 1 GPUs are in use. Try the CPU profile or come back later."
LOGIN_COOKIE = "jupyterhub-hub-login"


def early(hub, name: str) -> int:
    """How many of ``name``'s starts the early path refused so far."""
    return hub.log().count(f"Refused {name}'s start before JupyterHub's request handling")


def replayed(browser: httpx.AsyncClient, url: str, **changes: str) -> httpx.AsyncClient:
    """A client holding ``browser``'s cookies as they are now (``changes``: new values by
    cookie name), as a copy kept by someone else would be."""
    jar = httpx.Cookies()
    for c in browser.cookies.jar:
        jar.set(c.name, changes.get(c.name, c.value), domain=c.domain, path=c.path)
    return httpx.AsyncClient(base_url=url, cookies=jar, timeout=30)


@pytest.fixture
async def busy_hub(hub_factory, tmp_path):
    """A hub with one simulated GPU, held by alice's running server."""
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps(PROFILES))
    hub = await hub_factory(
        GPUHUB_PROFILES=str(path), GPUHUB_CREDITS="off", GPUHUB_GPUS="simulated:1"
    )
    await hub.create_user("alice")
    r = await hub.spawn("alice", {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    return hub


async def start(hub, browser, name: str, **kw):
    kw.setdefault("json", {"profile": "gpu"})
    return await hub.browser_api(browser, "POST", f"/users/{name}/server", **kw)


async def test_early_refusal_answers_what_jupyterhubs_own_path_answers(busy_hub):
    hub = busy_hub
    bob = await hub.login("bob")
    r = await start(hub, bob, "bob")
    assert early(hub, "bob") == 1, hub.log()[-3000:]
    token = await hub.create_user("bob")
    own = await hub.api("POST", "/users/bob/server", token=token, json={"profile": "gpu"})
    assert early(hub, "bob") == 1  # the token's request went JupyterHub's way
    assert (
        (r.status_code, r.json())
        == (own.status_code, own.json())
        == (409, {"status": 409, "message": REFUSAL})
    )
    assert r.headers["content-type"] == own.headers["content-type"]
    # a refused start made no server, by either path
    assert (await hub.api("GET", "/users/bob")).json()["servers"] == {}
    assert "jupyterhub-user-bob" not in hub.log()


async def test_requests_the_early_path_cannot_decide_get_jupyterhubs_own_answer(busy_hub):
    hub = busy_hub
    bob = await hub.login("bob")
    carol = await hub.login("carol")
    login = next(c.value for c in bob.cookies.jar if c.name == LOGIN_COOKIE)
    forged = login[:-4] + ("0000" if not login.endswith("0000") else "1111")
    cases = {
        # (client, URL's member, keyword arguments) -> JupyterHub's (status, message)
        "a forged login cookie (bad signature)": (
            replayed(bob, hub.url, **{LOGIN_COOKIE: forged}),
            "bob",
            {},
            (403, "Missing or invalid credentials."),
        ),
        "no XSRF token": (
            bob,
            "bob",
            {"headers": {"X-XSRFToken": ""}},
            (403, "'_xsrf' argument missing from POST"),
        ),
        "a wrong XSRF token": (
            bob,
            "bob",
            {"headers": {"X-XSRFToken": "2|forged|token"}},
            (403, "XSRF cookie does not match POST argument"),
        ),
        "another member's server": (
            bob,
            "carol",
            {},
            (404, "No access to resources or resources not found"),
        ),
        "a JSON body sent as text/plain (what a cross-site form can send)": (
            bob,
            "bob",
            {
                "json": None,
                "content": json.dumps({"profile": "gpu"}),
                "headers": {"Content-Type": "text/plain"},
            },
            (403, "Missing or invalid credentials."),
        ),
    }
    for what, (client, name, kw, expected) in cases.items():
        r = await start(hub, client, name, **kw)
        assert (r.status_code, r.json()["message"]) == expected, what
        assert early(hub, "bob") == 0, what

    # an admin starting bob's server: JupyterHub's path, and there the spawner's refusal
    boss = await hub.login("boss", groups=[MEMBERS, ADMINS])
    r = await start(hub, boss, "bob")
    assert (r.status_code, r.json()["message"]) == (409, REFUSAL)
    assert early(hub, "boss") == 0 and early(hub, "bob") == 0

    # JupyterHub's logout clears the browser's cookies and keeps the user's cookie_id: a
    # copy of them made before is still bob's in JupyterHub's own handlers, and here too
    kept = replayed(bob, hub.url)
    r = await bob.get("/hub/logout")
    assert not any(c.name == LOGIN_COOKIE for c in bob.cookies.jar), r.url
    assert (await hub.browser_api(kept, "GET", "/user")).json()["name"] == "bob"
    r = await start(hub, kept, "bob")
    assert (r.status_code, r.json()["message"]) == (409, REFUSAL)
    assert early(hub, "bob") == 1

    # a deleted member's cookie belongs to no one
    r = await hub.api("DELETE", "/users/bob")
    assert r.status_code == 204, r.text
    r = await start(hub, kept, "bob")
    assert (r.status_code, r.json()["message"]) == (403, "Missing or invalid credentials.")
    assert early(hub, "bob") == 1
    await kept.aclose()

    # a renamed member keeps the login cookie and is found under the new name only
    r = await hub.api("PATCH", "/users/carol", json={"name": "carla"})
    assert r.status_code == 200, r.text
    assert (await hub.browser_api(carol, "GET", "/user")).json()["name"] == "carla"
    r = await start(hub, carol, "carol")
    assert (r.status_code, r.json()["message"]) == (
        404,
        "No access to resources or resources not found",
    )
    assert early(hub, "carla") == 0
    r = await start(hub, carol, "carla")
    assert (r.status_code, r.json()["message"]) == (409, REFUSAL)
    assert early(hub, "carla") == 1
    await cases["a forged login cookie (bad signature)"][0].aclose()


async def test_a_start_that_can_be_granted_starts_through_jupyterhub(busy_hub):
    hub = busy_hub
    bob = await hub.login("bob")
    await hub.stop_server("alice")
    r = await start(hub, bob, "bob")
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("bob")
    assert early(hub, "bob") == 0
    # bob's server holds the GPU now: his second start is JupyterHub's "already running"
    r = await start(hub, bob, "bob")
    assert (r.status_code, r.json()["message"]) == (400, "bob is already running")
    assert early(hub, "bob") == 0
