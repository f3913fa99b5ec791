"""Reservations in a real hub: the REST API, its checks, its scope, the CLI and the page.

Real JupyterHub and proxy with the project's configuration, two simulated GPUs, groups
made through JupyterHub's own API.  Who asks:
- ``gpuhub-cli``: the CLI's token from the state dir (the admin scope, unfiltered);
- ``test-instructor``: a token whose role holds
  ``custom:gpuhub:reservations:admin!group=ml101`` only, as a course's instructors will;
- ``alice``: a member with no reservation scope; ``boss``: in the admin group, in a browser
  session (cookie and ``_xsrf``).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.fixtures.oidc import ADMINS

pytestmark = [pytest.mark.docker, pytest.mark.hub]

INSTRUCTOR = secrets.token_hex(16)
EXTRA = (
    f"c.JupyterHub.services.append({{'name': 'test-instructor', 'api_token': {INSTRUCTOR!r}}})\n"
    "c.JupyterHub.load_roles.append({'name': 'test-ml101-instructors', "
    "'services': ['test-instructor'], "
    "'scopes': ['custom:gpuhub:reservations:admin!group=ml101']})\n"
)
PATH = "/gpuhub/reservations"


def at(days: float, hour: int = 14) -> str:
    """ISO text of a time ``days`` from now at ``hour``:00 UTC."""
    day = datetime.now(UTC) + timedelta(days=days)
    return day.replace(hour=hour, minute=0, second=0, microsecond=0).isoformat()


def node(path) -> str:
    """Two whole simulated GPUs and one split into three 1g.5gb MIG slices."""
    gpu = {"name": "Simulated", "memory_total_mib": 16384}
    path.write_text(
        json.dumps(
            {
                "devices": [
                    {**gpu, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000"},
                    {**gpu, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001"},
                    {
                        **gpu,
                        "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000002",
                        "mig_mode": True,
                        "mig_devices": [
                            {
                                "uuid": f"MIG-aaaaaaaa-0000-0000-0000-00000000000{i}",
                                "profile": "1g.5gb",
                                "memory_total_mib": 4864,
                            }
                            for i in (0, 1, 2)
                        ],
                    },
                ]
            }
        )
    )
    return f"simulated:{path}"


async def hub_with_groups(hub_factory, tmp_path):
    hub = await hub_factory(
        extra_config=EXTRA, GPUHUB_CREDITS="off", GPUHUB_GPUS=node(tmp_path / "gpus.json")
    )
    for group in ("ml101", "ml102"):
        r = await hub.api("POST", f"/groups/{group}")
        assert r.status_code == 201, r.text
    cli = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    return hub, cli


async def listed(hub, token) -> list[dict]:
    r = await hub.api("GET", PATH, token=token)
    assert r.status_code == 200, r.text
    return r.json()["reservations"]


async def test_reservations_are_created_listed_edited_deleted_and_bad_ones_refused(
    hub_factory, tmp_path
):
    hub, admin = await hub_with_groups(hub_factory, tmp_path)

    # a weekly lab with one week off
    lab = {
        "group": "ml101",
        "gpus": 1,
        "start": at(7),
        "end": at(7, 16),
        "rrule": "FREQ=WEEKLY;COUNT=4",
        "exdates": [at(14)],
        "note": "ML101 lab",
    }
    r = await hub.api("POST", PATH, token=admin, json=lab)
    assert r.status_code == 201, r.text
    weekly = r.json()
    assert r.headers["location"] == f"/hub/api/gpuhub/reservations/{weekly['id']}"
    assert weekly["created_by"] == "gpuhub-cli"
    assert weekly["next"] == {"start": lab["start"], "end": lab["end"]}
    r = await hub.api("GET", f"{PATH}?from={at(0)}&to={at(40)}".replace("+", "%2B"), token=admin)
    starts = [o["start"] for o in r.json()["occurrences"]]
    assert starts == [at(7), at(21), at(28)]

    # bad input: each refused with its reason, nothing stored
    bad = [
        (
            {**lab, "group": "ml999"},
            400,
            "No such group: 'ml999'. Groups include: hub-admins, ml101, ml102.",
        ),
        ({**lab, "end": at(7, 13)}, 400, "must be after the start"),
        ({**lab, "rrule": "FREQ=WEEKLY;COUNT=2", "exdates": [at(7), at(14)]}, 400, "never occurs"),
        ({**lab, "rrule": "FREQ=WEEKLY;BYDAY=XX;COUNT=2"}, 400, "rrule: cannot read"),
        ({**lab, "gpus": 3}, 400, "The hub has 2 GPUs; a reservation of 3 can never be met"),
        ({**lab, "gpu": 1}, 400, "Unknown field(s): gpu"),
        (
            {"group": "ml102", "gpus": 2, "start": at(21, 15), "end": at(21, 17)},
            409,
            f"this reservation needs 2 and reservation {weekly['id']} (ml101, 1 GPU, ",
        ),
    ]
    for body, status, reason in bad:
        r = await hub.api("POST", PATH, token=admin, json=body)
        assert (r.status_code, reason in r.json().get("message", "")) == (status, True), r.text
    for content, status in (
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b"[" * 10000, 400),  # nested too deep: json.loads raises RecursionError
        (b'{"note": "' + b"x" * 20000 + b'"}', 413),
    ):
        r = await hub.api("POST", PATH, token=admin, content=content)
        assert r.status_code == status, r.text
    assert [x["id"] for x in await listed(hub, admin)] == [weekly["id"]]
    assert "Traceback" not in hub.log()

    # edit: the whole result is checked again; a refused edit changes nothing
    r = await hub.api("PATCH", f"{PATH}/{weekly['id']}", token=admin, json={"gpus": 2})
    assert r.status_code == 200 and r.json()["gpus"] == 2, r.text
    r = await hub.api("PATCH", f"{PATH}/{weekly['id']}", token=admin, json={"end": at(7, 12)})
    assert r.status_code == 400 and "must be after the start" in r.json()["message"]
    assert (await hub.api("GET", f"{PATH}/{weekly['id']}", token=admin)).json()["gpus"] == 2

    # MIG slices are counted apart from whole GPUs (both whole GPUs are reserved then)
    slices = {
        "group": "ml102",
        "gpus": 3,
        "mig_profile": "1g.5gb",
        "start": at(7, 15),
        "end": at(7, 16),
    }
    r = await hub.api("POST", PATH, token=admin, json={**slices, "gpus": 4})
    assert r.status_code == 400, r.text
    assert r.json()["message"] == (
        "The hub has 3 1g.5gb MIG slices; a reservation of 4 can never be met."
    )
    r = await hub.api("POST", PATH, token=admin, json=slices)
    assert r.status_code == 201, r.text
    assert (await hub.api("DELETE", f"{PATH}/{r.json()['id']}", token=admin)).status_code == 204

    # a course's instructor: their group only
    mine = {"group": "ml101", "gpus": 1, "start": at(2), "end": at(2, 15)}
    r = await hub.api("POST", PATH, token=INSTRUCTOR, json=mine)
    assert r.status_code == 201, r.text
    own = r.json()["id"]
    r = await hub.api("POST", PATH, token=admin, json={**mine, "group": "ml102"})
    other = r.json()["id"]
    r = await hub.api("POST", PATH, token=INSTRUCTOR, json={**mine, "group": "ml102"})
    assert r.status_code == 403 and "ml101 only" in r.json()["message"], r.text
    assert {x["id"] for x in await listed(hub, INSTRUCTOR)} == {weekly["id"], own}
    for method in ("GET", "PATCH", "DELETE"):
        r = await hub.api(
            method,
            f"{PATH}/{other}",
            token=INSTRUCTOR,
            **({"json": {"gpus": 1}} if method == "PATCH" else {}),
        )
        assert r.status_code == 404, (method, r.text)
    r = await hub.api("PATCH", f"{PATH}/{own}", token=INSTRUCTOR, json={"group": "ml102"})
    assert r.status_code == 403, r.text
    assert (await hub.api("DELETE", f"{PATH}/{own}", token=INSTRUCTOR)).status_code == 204

    # a member without the scope sees nothing and changes nothing
    alice = await hub.create_user("alice")
    for method, path in (
        ("GET", PATH),
        ("POST", PATH),
        ("GET", f"{PATH}/{other}"),
        ("DELETE", f"{PATH}/{other}"),
    ):
        r = await hub.api(method, path, token=alice, **({"json": mine} if method == "POST" else {}))
        assert r.status_code == 403, (method, path, r.text)

    assert (await hub.api("DELETE", f"{PATH}/{other}", token=admin)).status_code == 204
    assert (await hub.api("GET", f"{PATH}/{other}", token=admin)).status_code == 404
    assert [x["id"] for x in await listed(hub, admin)] == [weekly["id"]]


def gpuhub(hub, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "reservations", *args],
        capture_output=True,
        text=True,
        env=hub.env,
        timeout=60,
    )


async def test_the_cli_and_the_admin_page_manage_reservations(hub_factory, tmp_path):
    hub, admin = await hub_with_groups(hub_factory, tmp_path)

    made = gpuhub(
        hub,
        "create",
        "--group",
        "ml101",
        "--gpus",
        "2",
        "--start",
        at(3)[:16],
        "--end",
        at(3, 16)[:16],
        "--rrule",
        "FREQ=WEEKLY;COUNT=3",
        "--note",
        "ML101 lab",
    )
    assert made.returncode == 0, made.stderr
    [first] = await listed(hub, admin)
    assert (first["group"], first["gpus"], first["start"]) == ("ml101", 2, at(3))
    refused = gpuhub(
        hub, "create", "--group", "ml102", "--gpus", "1", "--start", at(10), "--end", at(10, 15)
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("gpuhub reservations create: Not enough GPUs at ")
    assert f"reservation {first['id']} (ml101, 2 GPUs" in refused.stderr
    edited = gpuhub(hub, "edit", str(first["id"]), "--gpus", "1")
    assert edited.returncode == 0, edited.stderr
    table = gpuhub(hub, "list")
    assert table.returncode == 0, table.stderr
    assert f"{first['id']}  ml101" in table.stdout and "1 GPU" in table.stdout
    assert json.loads(gpuhub(hub, "list", "--json").stdout)["reservations"][0]["gpus"] == 1

    # the page: admins only; its form and Delete use the API with the _xsrf token
    boss = await hub.login("boss", groups=[ADMINS])
    alice = await hub.login("alice")
    assert 'href="/hub/reservations"' in (await boss.get("/hub/home")).text
    assert 'href="/hub/reservations"' not in (await alice.get("/hub/home")).text
    assert (await alice.get("/hub/reservations")).status_code == 403
    page = await boss.get("/hub/reservations")
    assert page.status_code == 200
    assert "ML101 lab" in page.text and f'data-id="{first["id"]}"' in page.text
    r = await hub.browser_api(
        boss,
        "POST",
        PATH,
        json={
            "group": "ml102",
            "gpus": 1,
            "start": at(4),
            "end": at(4, 15),
            "note": "<script>alert(1)</script>",
        },
    )
    assert r.status_code == 201, r.text
    page = await boss.get("/hub/reservations")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "<script>alert(1)" not in page.text
    url = f"{PATH}/{r.json()['id']}"
    no_xsrf = await boss.request("DELETE", "/hub/api" + url)
    assert no_xsrf.status_code == 403
    assert (await hub.browser_api(boss, "DELETE", url)).status_code == 204

    assert gpuhub(hub, "delete", str(first["id"])).returncode == 0
    assert await listed(hub, admin) == []
    gone = gpuhub(hub, "delete", str(first["id"]))
    assert gone.returncode == 1 and f"No reservation {first['id']}" in gone.stderr


async def test_an_instructor_is_held_to_the_bounds_and_reads_no_other_courses_reservation(
    hub_factory, tmp_path
):
    """Issue 28: an instructor of ml101 (no course entry: the default bounds, 1 of the 2
    GPUs, 8 hours, 120 days, 15 minutes' warning) cannot take the whole hub, and a 409
    names no reservation of ml102; an admin can do all of it."""
    hub, admin = await hub_with_groups(hub_factory, tmp_path)
    now = datetime.now(UTC).replace(microsecond=0)
    refused = [
        # both GPUs from now for 30 days
        (
            {"gpus": 2, "start": now.isoformat(), "end": (now + timedelta(days=30)).isoformat()},
            "An instructor's reservation starts at least 15 min from now, so that members "
            "whose servers hold the GPUs are warned first",
        ),
        (
            {"gpus": 1, "start": at(1), "end": at(31)},
            "ml101's reservations last at most 8 hours per occurrence; this one lasts 720 h.",
        ),
        (
            {
                "gpus": 1,
                "start": at(1),
                "end": at(1, 16),
                "rrule": "FREQ=WEEKLY;INTERVAL=3;COUNT=1000",
            },
            "ml101's reservations reach at most 120 days ahead",
        ),
        (
            {"gpus": 2, "start": at(1), "end": at(1, 16)},
            "ml101 may reserve at most 1 GPU at once, half of the hub's 2; this reservation "
            "asks for 2.",
        ),
    ]
    for fields, words in refused:
        r = await hub.api("POST", PATH, token=INSTRUCTOR, json={"group": "ml101", **fields})
        assert r.status_code == 403 and words in r.json()["message"], (fields, r.text)
    assert await listed(hub, admin) == []

    # ml102's lab holds both GPUs on day 3: the instructor of ml101 reads no name in the 409
    r = await hub.api(
        "POST",
        PATH,
        token=admin,
        json={"group": "ml102", "gpus": 2, "start": at(3), "end": at(3, 16)},
    )
    assert r.status_code == 201, r.text
    other = r.json()["id"]
    assert (await hub.api("GET", f"{PATH}/{other}", token=INSTRUCTOR)).status_code == 404
    mine = {"group": "ml101", "gpus": 1, "start": at(3, 15), "end": at(3, 17)}
    r = await hub.api("POST", PATH, token=INSTRUCTOR, json=mine)
    assert r.status_code == 409, r.text
    text = r.json()["message"]
    assert text.startswith("Not enough GPUs from ") and "other reservations leave 0 free" in text
    assert "ml102" not in text and f"reservation {other}" not in text and "16:00" not in text
    # an admin reads whose it is
    r = await hub.api("POST", PATH, token=admin, json=mine)
    assert r.status_code == 409 and f"reservation {other} (ml102, 2 GPUs, " in r.json()["message"]

    # admins keep full power: both GPUs from now for 30 days
    r = await hub.api(
        "POST",
        PATH,
        token=admin,
        json={"group": "ml101", "gpus": 2, "start": at(5), "end": at(35), "note": "by an admin"},
    )
    assert r.status_code == 201, r.text
    big = r.json()["id"]
    # the instructor may give back (a note, fewer GPUs), not add
    r = await hub.api("PATCH", f"{PATH}/{big}", token=INSTRUCTOR, json={"gpus": 1, "note": "less"})
    assert r.status_code == 200 and r.json()["gpus"] == 1, r.text
    r = await hub.api("PATCH", f"{PATH}/{big}", token=INSTRUCTOR, json={"end": at(36)})
    assert r.status_code == 403 and "last at most 8 hours" in r.json()["message"], r.text
    assert "Traceback" not in hub.log()
