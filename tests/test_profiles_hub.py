"""The profile list in a running hub: the spawn page, the availability endpoint, the API."""

from __future__ import annotations

import json
import re

import pytest

from tests.fixtures.hub import _need

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [
    {
        "display_name": "CPU only",
        "slug": "cpu",
        "default": True,
        "credits_per_hour": 0,
        "description": "No GPU, for <b>small</b> work",
    },
    {
        "display_name": "PyTorch",
        "slug": "pytorch",
        "gpus": 1,
        "credits_per_hour": 2,
        "spawner_override": {"image": "gpuhub/pytorch:latest"},
        "profile_options": {
            "gpus": {
                "display_name": "GPUs",
                "choices": {
                    "1": {"display_name": "1 GPU", "spawner_override": {"gpus": 1}},
                    "2": {"display_name": "2 GPUs", "spawner_override": {"gpus": 2}},
                },
            }
        },
    },
    {"display_name": "Course", "slug": "course", "gpus": 1, "allowed_groups": ["ml101"]},
]


@pytest.fixture
async def hub(hub_factory, tmp_path, docker_client):
    try:
        docker_client.inspect_image("gpuhub/pytorch:latest")
    except Exception:  # noqa: BLE001
        _need(False, "gpuhub/pytorch:latest is not built; run scripts/build-images.sh pytorch")
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps(PROFILES))
    return await hub_factory(GPUHUB_PROFILES=str(path), GPUHUB_CREDITS="off")


def cards(html: str) -> dict[str, str]:
    return dict(
        re.findall(
            r'<label class="gpuhub-card[^"]*"\s+for="profile-([a-z0-9-]+)"'
            r"[^>]*>(.*?)</label>",
            html,
            re.S,
        )
    )


async def test_spawn_page_shows_cards_with_contents_cost_and_free_gpus(hub):
    browser = await hub.login("alice")
    html = (await browser.get("/hub/spawn")).text
    shown = cards(html)
    assert set(shown) == {"cpu", "pytorch"}  # "course" is for ml101 only
    assert "2 of 2 GPUs free now" in shown["pytorch"]
    assert "(simulated GPUs)" in shown["pytorch"]
    assert "2.00 credits per hour" in shown["pytorch"]
    assert re.search(r"<dt>PyTorch</dt><dd>2\.\d+", shown["pytorch"])
    assert "<dt>Python</dt><dd>3.11" in shown["pytorch"]
    assert "&lt;b&gt;small&lt;/b&gt;" in shown["cpu"]  # autoescaped, never raw HTML
    [radio] = re.findall(r"<input[^>]*>", shown["pytorch"])
    assert 'value="pytorch"' in radio and "disabled" not in radio


async def test_admin_sees_every_profile(hub):
    await hub.create_user("root-admin", admin=True)
    browser = await hub.login("root-admin")
    assert set(cards((await browser.get("/hub/spawn")).text)) == {"cpu", "pytorch", "course"}


async def test_full_pool_disables_the_gpu_profile_before_the_click(hub, docker_client):
    for user in ("bob", "carol"):
        await hub.create_user(user)
        r = await hub.spawn(user, {"profile": "pytorch"})
        assert r.status_code in (201, 202), r.text
    browser = await hub.login("alice")
    html = cards((await browser.get("/hub/spawn")).text)["pytorch"]
    assert re.search(r'value="pytorch"[^>]*disabled', html)
    assert "No GPU free: all 2 GPUs are in use" in html

    r = await browser.get("/hub/api/gpuhub/availability")
    assert r.status_code == 200
    model = r.json()
    assert (model["free"], model["total"], model["inventory"]) == (0, 2, "simulated")
    assert model["profiles"]["pytorch"]["available"] is False
    assert model["profiles"]["cpu"]["available"] is True

    await hub.stop_server("bob")
    model = (await browser.get("/hub/api/gpuhub/availability")).json()
    assert model["free"] == 1 and model["profiles"]["pytorch"]["available"] is True


async def test_a_choice_that_cannot_start_is_disabled_before_the_click(hub):
    await hub.create_user("bob")
    r = await hub.spawn("bob", {"profile": "pytorch", "gpus": "1"})
    assert r.status_code in (201, 202), r.text
    browser = await hub.login("alice")
    html = cards((await browser.get("/hub/spawn")).text)["pytorch"]
    two = re.search(r'<option value="2"[^>]*>[^<]*', html).group(0)
    assert "disabled" in two and "(cannot start now)" in two
    assert "only 1 of 2 are free" in two  # the reason, in its title
    one = re.search(r'<option value="1"[^>]*>', html).group(0)
    assert "selected" in one and "disabled" not in one

    model = (await browser.get("/hub/api/gpuhub/availability")).json()["profiles"]["pytorch"]
    assert model["available"] is True
    assert model["choices"]["gpus"]["1"] == ""
    assert "only 1 of 2 are free" in model["choices"]["gpus"]["2"]


PER_USER = """
{prefix}def _profiles(spawner):
    profiles = [{{"display_name": "CPU only", "slug": "cpu", "default": True}}]
    if spawner.user.name == "alice":
        profiles.append({{"display_name": "Alice's project", "slug": "alice-gpu", "gpus": 1}})
    return profiles
c.GPUDockerSpawner.profile_list = _profiles
"""


@pytest.mark.parametrize(
    "prefix", [pytest.param("", id="sync"), pytest.param("async ", id="async")]
)
async def test_profile_list_may_be_a_callable_per_member(hub_factory, prefix):
    hub = await hub_factory(extra_config=PER_USER.format(prefix=prefix), GPUHUB_CREDITS="off")
    alice = await hub.login("alice")
    assert set(cards((await alice.get("/hub/spawn")).text)) == {"cpu", "alice-gpu"}
    bob = await hub.login("bob")
    assert set(cards((await bob.get("/hub/spawn")).text)) == {"cpu"}
    r = await hub.spawn("bob", {"profile": "alice-gpu"})
    assert r.status_code == 400, r.text
    assert "No such profile: 'alice-gpu'. Options include: cpu" in r.json()["message"]
    r = await hub.spawn("alice", {"profile": "alice-gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")


async def test_availability_needs_login(hub):
    r = await hub.client.get("/hub/api/gpuhub/availability")
    assert r.status_code == 403
    assert "free" not in r.json()


@pytest.mark.parametrize(
    "options, expected",
    [
        pytest.param(
            {"profile": "gpu-x"},
            "No such profile: 'gpu-x'. Options include: cpu, pytorch",
            id="unknown-slug",
        ),
        pytest.param({"profile": "course"}, "not open to your groups", id="group-forbidden"),
        pytest.param({"profile": "pytorch", "gpus": "3"}, "Choices: 1, 2", id="bad-choice"),
        pytest.param({"profile": "pytorch", "colour": "red"}, "Unexpected field", id="extra-field"),
        pytest.param(
            {"profile": "pytorch", "image": "evil/miner:latest"},
            "Unexpected field",
            id="forged-image",
        ),
        pytest.param(
            {"profile": "pytorch", "gpus": "8"}, "Choices: 1, 2", id="more-gpus-than-the-profile"
        ),
    ],
)
async def test_bad_user_options_get_400_with_the_choices_and_reserve_nothing(
    hub, docker_client, options, expected
):
    await hub.create_user("mallory")
    r = await hub.spawn("mallory", options)
    assert r.status_code == 400, r.text
    assert expected in r.json()["message"]
    assert hub.containers(docker_client) == []
    model = (await hub.api("GET", "/gpuhub/availability")).json()
    assert model["free"] == 2


async def test_kubespawner_style_options_pick_profile_and_choice(hub, docker_client):
    await hub.create_user("alice")
    r = await hub.spawn("alice", {"profile": "pytorch", "gpus": "2"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    [c] = hub.containers(docker_client)
    assert len(c["Labels"]["io.gpuhub.devices"].split(",")) == 2
    assert c["Labels"]["io.gpuhub.profile"] == "pytorch"
    assert c["Image"] == "gpuhub/pytorch:latest"


async def test_empty_options_give_the_default_profile(hub, docker_client):
    await hub.create_user("alice")
    r = await hub.spawn("alice", {})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    [c] = hub.containers(docker_client)
    assert c["Labels"]["io.gpuhub.profile"] == "cpu"
    assert c["Labels"]["io.gpuhub.devices"] == ""
    # the admin panel (and the REST API it reads) shows which profile {} meant
    server = (await hub.api("GET", "/users/alice")).json()["servers"][""]
    assert server["user_options"] == {"profile": "cpu"}


async def test_oversized_or_refused_options_stay_small_and_are_not_kept(hub, docker_client):
    await hub.create_user("alice")
    r = await hub.spawn("alice", {"profile": "pytorch", "gpus": "1"})  # a valid choice
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    await hub.stop_server("alice")
    browser = await hub.login("alice")
    xsrf = next(c.value for c in browser.cookies.jar if c.name == "_xsrf")
    # 900 KiB: over a hundred times user_options' 8 KiB, under the hub's 1 MiB body limit
    # (hub_ext.ops.serving.limit_request_bodies; a larger body never reaches a handler:
    # tests/test_body_size_hub.py)
    huge = "B" * (900 * 1024)

    def log_size() -> int:
        return hub.log_path.stat().st_size

    database = hub.state_dir / "jupyterhub.sqlite"
    database_before = database.stat().st_size  # SQLite keeps its size after a rewrite

    # the REST API: a short 4xx, and the log grows by a few lines
    before = log_size()
    r = await hub.spawn("alice", {"profile": huge})
    assert 400 <= r.status_code < 500, r.text[:300]
    assert len(r.content) < 1024, r.text[:300]
    assert "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB" not in r.text
    assert log_size() - before < 10_000

    # the spawn form: the same
    before = log_size()
    r = await browser.post("/hub/spawn", data={"profile": huge}, headers={"X-XSRFToken": xsrf})
    assert 400 <= r.status_code < 500, r.text[-500:]
    assert "B" * 64 not in r.text
    assert log_size() - before < 10_000

    # a stopped named server's options changed through the API (JupyterHub's PATCH, which
    # logs them): not stored, and the log line is cut short
    r = await hub.api("PUT", "/users/alice/servers/named", json={"user_options": {}})
    assert r.status_code == 201, r.text[:300]
    before = log_size()
    r = await hub.api(
        "PATCH", "/users/alice/servers/named", json={"user_options": {"profile": huge}}
    )
    assert r.status_code < 500, r.text[:300]
    assert log_size() - before < 10_000
    assert database.stat().st_size - database_before < 1024 * 1024  # never stored

    # a small choice refused for what it is
    r = await hub.spawn("alice", {"profile": "gpu-x"})
    assert r.status_code == 400, r.text

    # none of them became the next start's default: {} is the last valid choice
    assert hub.containers(docker_client) == []
    r = await hub.spawn("alice", {})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    [c] = hub.containers(docker_client)
    assert c["Labels"]["io.gpuhub.profile"] == "pytorch"
    server = (await hub.api("GET", "/users/alice")).json()["servers"][""]
    assert server["user_options"] == {"profile": "pytorch", "gpus": "1"}
