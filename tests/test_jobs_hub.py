"""GPU notebook jobs in a real hub: created through the REST API with a member's token, run
by ``gpuhub-notebook-job`` in a container of the profile's image with a GPU from the pool,
settled by the credits hook, stopped, found again after a kill -9 of the hub.

Real parts: JupyterHub and its proxy, Docker, the reference credits service, GPUs from the
NVML stand-in (the container gets ``NVIDIA_VISIBLE_DEVICES`` from the hook stand-in).  The
members' workspaces are host folders (``GPUHUB_WORKSPACE``), owned by uid 1000 as a
member's are, so the test reads the output notebooks as the member would find them.  The
"gpu" profile costs 4 credits per hour: 1.00 per 15-minute interval.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.fixtures.hub import eventually

pytestmark = [pytest.mark.docker, pytest.mark.hub]

GPU_A = "GPU-0b0b0b0b-0000-4000-8000-00000000000a"
GPU_B = "GPU-0b0b0b0b-0000-4000-8000-00000000000b"
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
    {"display_name": "Course GPU", "slug": "course", "gpus": 1, "allowed_groups": ["ml101"]},
]
JOBS = "/gpuhub/jobs"


def node(*uuids: str) -> dict:
    """Busy GPUs (no GPU-idle cull)."""
    return {
        "devices": [
            {"uuid": u, "name": "Stand-in", "memory_total_mib": 16384, "utilization_gpu": 90}
            for u in uuids
        ]
    }


def notebook(*sources: str, parameters: str = "") -> str:
    """An nbformat 4 notebook: a cell tagged ``parameters`` (papermill's), then ``sources``."""
    cells = []
    if parameters:
        cells.append(
            {
                "cell_type": "code",
                "metadata": {"tags": ["parameters"]},
                "source": parameters,
                "outputs": [],
                "execution_count": None,
            }
        )
    cells += [
        {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
        for s in sources
    ]
    return json.dumps(
        {
            "cells": cells,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
            "nbformat": 4,
            "nbformat_minor": 4,
        }
    )


#: a notebook whose metadata nests lists 2000 deep: more than Python's json parser goes
NESTED = '{"nbformat": 4, "cells": [], "metadata": {"a": ' + "[" * 2000 + "]" * 2000 + "}}"

#: writes the GPU it sees and a value computed from a papermill parameter
GPU_NOTEBOOK = notebook(
    "import os\nprint('GPU seen:', os.environ.get('NVIDIA_VISIBLE_DEVICES'))",
    "print('squared:', int(n) ** 2)",
    parameters='n = "2"',
)


def home(root: Path, user: str, files: dict[str, str | bytes]) -> Path:
    """``user``'s workspace under ``root``, owned by uid 1000 (a member's), with ``files``."""
    path = root / user
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 1000, 100)
    path.chmod(0o700)
    for name, data in files.items():
        target = path / name
        for folder in reversed(target.relative_to(path).parents[:-1]):
            (path / folder).mkdir(exist_ok=True)
            os.chown(path / folder, 1000, 100)
        if isinstance(data, str):
            data = data.encode()
        target.write_bytes(data)
        os.chown(target, 1000, 100)
    return path


async def entries(admin, account) -> list[tuple[str, str]]:
    return [(t.kind, str(t.amount)) async for t in admin.iter_transactions(account)][::-1]


async def job(hub, token, job_id) -> dict:
    r = await hub.api("GET", f"{JOBS}/{job_id}", token)
    assert r.status_code == 200, r.text
    return r.json()


async def ended(hub, token, job_id, timeout: float = 120) -> dict:
    async def done():
        model = await job(hub, token, job_id)
        return model if model["status"] in ("COMPLETED", "FAILED", "STOPPED") else None

    return await eventually(done, timeout, f"job {job_id} ended")


async def status_is(hub, token, job_id, status: str, timeout: float = 60) -> dict:
    async def there():
        model = await job(hub, token, job_id)
        return model if model["status"] == status else None

    return await eventually(there, timeout, f"job {job_id} {status}")


async def gpus_free(hub) -> int:
    r = await hub.api("GET", "/gpuhub/availability")
    return r.json()["free"]


async def with_credits(hub, ledger_admin, *names: str) -> dict[str, str]:
    """Members ``names``, 10.00 credits each: {name: an API token of theirs}."""
    tokens = {name: await hub.create_user(name) for name in names}
    for name in names:
        await ledger_admin.grant(name, "10.00", key=f"test-grant-{name}")
    return tokens


async def gpu_server(hub, name: str) -> None:
    """``name``'s server on the "gpu" profile, ready: it holds a GPU."""
    r = await hub.spawn(name, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name)


def members(prefix: str, *names: str) -> list[str]:
    """Names with no character DockerSpawner escapes in a workspace path ("-")."""
    return [prefix.replace("-", "") + name for name in names]


@pytest.fixture(scope="module")
def job_runner(docker_client, notebook_image) -> str:
    """The notebook image, with ``gpuhub-notebook-job`` on its PATH (built from this tree
    by scripts/build-images.sh); skipped locally, failed in CI, when it is an older one."""
    from tests.fixtures.hub import _need, image_has

    _need(
        image_has(docker_client, notebook_image, "gpuhub-notebook-job"),
        f"{notebook_image} has no gpuhub-notebook-job: run scripts/build-images.sh",
    )
    return notebook_image


@pytest.fixture
def workspaces(tmp_path, job_runner) -> Path:
    root = tmp_path / "homes"
    root.mkdir()
    return root


def hub_env(workspaces: Path, **env) -> dict:
    return {
        "GPUHUB_WORKSPACE": str(workspaces / "{username}"),
        "GPUHUB_WORKSPACE_ROOT": str(workspaces),
        **env,
    }


async def test_hostile_job_requests_are_refused_and_nothing_starts_or_is_charged(
    gpu_hub, ledger_admin, credits_username, workspaces, docker_client
):
    hub = await gpu_hub(
        node(GPU_A),
        PROFILES,
        "c.Jobs.check_interval = 0.5\n",
        **hub_env(
            workspaces,
            GPUHUB_JOB_NOTEBOOK_MAX_MIB="1",
            GPUHUB_JOBS_PER_USER="2",
            GPUHUB_NAMED_SERVER_LIMIT="5",
        ),
    )
    alice, bob, carol = members(credits_username, "alice", "bob", "carol")
    outside = workspaces.parent / "outside.ipynb"
    outside.write_text(GPU_NOTEBOOK)
    mine = home(
        workspaces,
        alice,
        {
            "ok.ipynb": GPU_NOTEBOOK,
            "big.ipynb": notebook("x = 1", parameters="pad = '" + "p" * 2**20 + "'"),
            "plain.ipynb": "print('not a notebook')\n",
            "nested.ipynb": NESTED,
        },
    )
    os.symlink(outside, mine / "link.ipynb")
    os.symlink(workspaces.parent, mine / "up")
    home(workspaces, bob, {"ok.ipynb": notebook("import time\ntime.sleep(600)")})
    home(workspaces, carol, {"ok.ipynb": GPU_NOTEBOOK})
    tokens = {name: await hub.create_user(name) for name in (alice, bob, carol)}
    for name in (alice, bob):
        await ledger_admin.grant(name, "10.00", key=f"test-grant-{name}")
    before = {name: await entries(ledger_admin, name) for name in (alice, bob)}

    async def create(who, **body):
        body.setdefault("runtime_environment_name", "gpu")
        return await hub.api("POST", JOBS, tokens[who], json=body)

    # bob's job holds the only GPU: what alice tries next is never answered by "no GPU"
    r = await create(bob, input_uri="ok.ipynb")
    assert r.status_code == 201, r.text
    bobs = r.json()["job_id"]

    r = await hub.api("GET", f"{JOBS}/environments", tokens[alice])
    assert [e["name"] for e in r.json()["environments"]] == ["gpu"], r.text
    # the profile's name says its GPU: the label does not say it twice (issue 28)
    label = r.json()["environments"][0]["label"]
    assert re.fullmatch(r"One GPU, 4\.00 credits/h, [01] of 1 free", label), label

    cases = [
        (
            {"input_uri": "ok.ipynb", "runtime_environment_name": "gpu-x"},
            404,
            "No such environment",
        ),
        ({"input_uri": "ok.ipynb", "runtime_environment_name": "course"}, 403, "not open to you"),
        ({"input_uri": "ok.ipynb", "runtime_environment_name": "cpu"}, 403, "does not run"),
        ({"input_uri": "../outside.ipynb"}, 400, "leaves your workspace"),
        ({"input_uri": f"/{workspaces.parent}/outside.ipynb"}, 400, "relative"),
        ({"input_uri": "link.ipynb"}, 403, "link"),
        ({"input_uri": "up/outside.ipynb"}, 403, "link"),
        ({"input_uri": "big.ipynb"}, 413, "at most 1 MiB"),
        ({"input_uri": "plain.ipynb"}, 400, "does not read as a notebook"),
        ({"input_uri": "nested.ipynb"}, 400, "nests lists or objects too deeply"),
        # refused for its parameters before the notebook is looked for (issue 28)
        (
            {"input_uri": "missing.ipynb", "parameters": {f"p{i}": "x" * 900 for i in range(9)}},
            413,
            "parameters and file names come to",
        ),
        ({"input_uri": "ok.ipynb", "parameters": "n=3"}, 400, "JSON object of strings"),
        ({"input_uri": "ok.ipynb", "parameters": {"n": 3}}, 400, "must be a string"),
        ({"input_uri": "ok.ipynb", "output_formats": ["exe"]}, 400, "output_formats"),
    ]
    for body, status, words in cases:
        r = await create(alice, **body)
        assert (r.status_code, words in r.json()["message"]) == (status, True), (body, r.text)
    r = await hub.api("POST", JOBS, tokens[alice], content=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["message"]
    r = await hub.api("POST", JOBS, tokens[alice], content=b" " * (300 * 1024))
    assert r.status_code == 413

    # the same 402 sentence as a server of that profile
    r = await create(carol, input_uri="ok.ipynb")
    server = await hub.spawn(carol, {"profile": "gpu"})
    assert (r.status_code, server.status_code) == (402, 402), (r.text, server.text)
    assert r.json()["message"] == server.json()["message"]

    # another member's job does not exist for alice
    for method, path in [
        ("GET", f"{JOBS}/{bobs}"),
        ("POST", f"{JOBS}/{bobs}/stop"),
        ("DELETE", f"{JOBS}/{bobs}"),
        ("POST", f"{JOBS}/{bobs}/report"),
    ]:
        r = await hub.api(method, path, tokens[alice], json={"exit_code": 0})
        assert r.status_code == 404, (method, path, r.text)
    r = await hub.api("GET", f"{JOBS}?user={bob}", tokens[alice])
    assert r.status_code == 403
    r = await hub.api("GET", JOBS, tokens[alice])
    assert r.json()["jobs"] == [] and r.json()["total_count"] == 0
    # bob cannot report his own job's end: only its server's token can
    r = await hub.api("POST", f"{JOBS}/{bobs}/report", tokens[bob], json={"exit_code": 0})
    assert r.status_code == 403

    # a token without the scope
    r = await hub.api("POST", f"/users/{alice}/tokens", json={"scopes": ["read:users:name!user"]})
    narrow = r.json()["token"]
    r = await hub.api("GET", JOBS, narrow)
    assert r.status_code == 403

    # a forged job server, through JupyterHub's own API
    bobs_server = (await job(hub, tokens[bob], bobs))["server_name"]
    forged = [  # (a refused named server stays in JupyterHub's list, as for any refusal)
        (f"/users/{alice}/servers/mine", {"profile": "gpu", "job": {"id": "x"}}),
        (f"/users/{alice}/servers/job-0123456789ab", {"profile": "gpu"}),
        (
            f"/users/{alice}/servers/job-0123456789ab",
            {"profile": "gpu", "job": {"id": "x", "input": "ok.ipynb"}},
        ),
        (f"/users/{alice}/servers/{bobs_server}", {"profile": "gpu"}),
    ]
    for path, options in forged:
        r = await hub.api("POST", path, tokens[alice], json=options)
        assert r.status_code == 403, (path, r.text)

    # nothing of alice's started, nothing charged, no row, no server, no file
    users = (await hub.api("GET", f"/users/{alice}")).json()
    assert users["servers"] == {}
    assert not [c for c in hub.containers(docker_client) if alice in c["Names"][0]]
    assert await entries(ledger_admin, alice) == before[alice]
    assert not (mine / "jobs").exists()

    # the per-member limit (GPUHUB_JOBS_PER_USER=2): queued or running
    bob2 = await create(bob, input_uri="ok.ipynb", name="second")
    assert bob2.status_code == 201, bob2.text
    r = await create(bob, input_uri="ok.ipynb", name="third")
    assert r.status_code == 409 and "each member may have 2" in r.json()["message"], r.text
    for job_id in (bobs, bob2.json()["job_id"]):
        r = await hub.api("POST", f"{JOBS}/{job_id}/stop", tokens[bob])
        assert r.status_code == 204, r.text
        assert (await ended(hub, tokens[bob], job_id))["status"] == "STOPPED"


async def test_a_job_waits_in_line_runs_on_its_gpu_and_is_settled_then_one_is_stopped(
    gpu_hub, ledger_admin, credits_username, workspaces, docker_client
):
    short = {"display_name": "Short GPU", "slug": "short", "gpus": 1, "job_max_seconds": 2}
    hub = await gpu_hub(
        node(GPU_A), [*PROFILES, short], "c.Jobs.check_interval = 0.5\n", **hub_env(workspaces)
    )
    alice, bob = members(credits_username, "alice", "bob")
    mine = home(
        workspaces,
        alice,
        {
            "course/train.ipynb": GPU_NOTEBOOK,
            "course/slow.ipynb": notebook("import time\ntime.sleep(600)"),
        },
    )
    tokens = await with_credits(hub, ledger_admin, alice, bob)

    # bob's GPU server holds the only GPU: alice's job waits in the same line
    await gpu_server(hub, bob)
    r = await hub.api(
        "POST",
        JOBS,
        tokens[alice],
        json={
            "input_uri": "course/train.ipynb",
            "runtime_environment_name": "gpu",
            "parameters": {"n": "7"},
            "output_formats": ["ipynb", "html"],
            "name": "train",
        },
    )
    assert r.status_code == 201, r.text
    first = r.json()["job_id"]
    waiting = await job(hub, tokens[alice], first)
    assert waiting["status"] == "QUEUED", waiting

    async def placed():
        model = await job(hub, tokens[alice], first)
        return model["place"] if model.get("place", {}).get("position") else None

    place = await eventually(placed, 20, "a place in line")
    assert (place["position"], place["ahead"]) == (1, 0), place
    assert place["estimate"], place
    # the one line the Scheduler shows (bob's server runs: an estimate in seconds)
    assert re.fullmatch(
        r"Waiting for a GPU: 1st in line, (about \d+ (min|h).*|less than a minute)",
        place["message"],
    ), place
    assert await entries(ledger_admin, alice) == [("grant", "10.00")]  # nothing while waiting

    # the server stops: the job starts by itself, computes, ends
    await hub.stop_server(bob)
    done = await ended(hub, tokens[alice], first)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    assert done["start_time"] and done["end_time"] >= done["start_time"]
    executed = json.loads((mine / done["outputs"]["ipynb"]).read_text())
    printed = "".join(
        "".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])
    )
    assert f"GPU seen: {GPU_A}" in printed and "squared: 49" in printed, printed
    assert (mine / done["outputs"]["html"]).stat().st_size > 0
    assert (mine / done["outputs"]["log"]).exists()
    assert (mine / done["outputs"]["ipynb"]).stat().st_uid == 1000  # the member's own
    # the copy ran, the original is untouched
    assert json.loads((mine / done["input_path"]).read_text()) == json.loads(GPU_NOTEBOOK)
    assert await eventually(lambda: _free(hub, 1), 20, "the GPU free again")

    async def settled():
        got = await entries(ledger_admin, alice)
        return got if len(got) == 3 else None

    assert await eventually(settled, 30, "debit and refund") == [
        ("grant", "10.00"),
        ("debit", "1.00"),
        ("refund", "1.00"),
    ]
    # the job's server is gone from the member's list once it ended
    assert (await hub.api("GET", f"/users/{alice}")).json()["servers"] == {}

    # a running job stopped: STOPPED, the GPU back, the unused interval refunded
    r = await hub.api(
        "POST",
        JOBS,
        tokens[alice],
        json={"input_uri": "course/slow.ipynb", "runtime_environment_name": "gpu"},
    )
    assert r.status_code == 201, r.text
    slow = r.json()["job_id"]
    await status_is(hub, tokens[alice], slow, "IN_PROGRESS")
    assert await gpus_free(hub) == 0
    # the running job is a named server JupyterHub does not count against her limit (1):
    # she may start one of her own; her home page (and the admin panel) name the job
    r = await hub.spawn(alice, {"profile": "cpu"}, server="notes")
    assert r.status_code in (201, 202), r.text
    servers = (await hub.api("GET", f"/users/{alice}")).json()["servers"]
    assert servers[(await job(hub, tokens[alice], slow))["server_name"]]["display_name"] == (
        "Notebook job: slow"
    ), servers
    await hub.wait_ready(alice, "notes")
    await hub.stop_server(alice, "notes")
    r = await hub.api("POST", f"{JOBS}/{slow}/stop", tokens[alice])
    assert r.status_code == 204, r.text
    stopped = await ended(hub, tokens[alice], slow, 30)
    assert (stopped["status"], stopped["status_message"]) == ("STOPPED", "Stopped by you."), stopped
    assert await eventually(lambda: _free(hub, 1), 20, "the GPU free after the stop")

    async def refunded():
        got = await entries(ledger_admin, alice)
        return got if len(got) == 5 else None

    assert (await eventually(refunded, 30, "the second refund"))[3:] == [
        ("debit", "1.00"),
        ("refund", "1.00"),
    ]
    listed = (await hub.api("GET", JOBS, tokens[alice])).json()
    assert [(j["job_id"], j["status"]) for j in listed["jobs"]] == [
        (slow, "STOPPED"),
        (first, "COMPLETED"),
    ]

    # a job past its profile's maximum run time is stopped
    r = await hub.api(
        "POST",
        JOBS,
        tokens[alice],
        json={"input_uri": "course/slow.ipynb", "runtime_environment_name": "short"},
    )
    assert r.status_code == 201, r.text
    capped = await ended(hub, tokens[alice], r.json()["job_id"], 60)
    assert capped["status"] == "STOPPED", capped
    assert "maximum run time (2 s)" in capped["status_message"], capped
    assert await eventually(lambda: _free(hub, 1), 20, "the GPU free after the maximum run time")


async def _free(hub, count: int) -> bool:
    return await gpus_free(hub) == count


@pytest.mark.parametrize(
    "sig", [pytest.param(signal.SIGKILL, id="kill-9"), pytest.param(signal.SIGTERM, id="sigterm")]
)
async def test_after_a_hub_restart_a_running_job_is_settled_once_and_a_waiting_one_keeps_its_place(
    gpu_hub, ledger_admin, credits_username, workspaces, docker_client, sig
):
    hub = await gpu_hub(
        node(GPU_A), PROFILES, "c.Jobs.check_interval = 0.5\n", **hub_env(workspaces)
    )
    alice, bob = members(credits_username, "alice", "bob")
    mine = home(
        workspaces,
        alice,
        {"long.ipynb": notebook("import time\ntime.sleep(15)\nprint('slept')")},
    )
    home(workspaces, bob, {"quick.ipynb": GPU_NOTEBOOK})
    tokens = await with_credits(hub, ledger_admin, alice, bob)

    async def create(who, path):
        r = await hub.api(
            "POST", JOBS, tokens[who], json={"input_uri": path, "runtime_environment_name": "gpu"}
        )
        assert r.status_code == 201, r.text
        return r.json()["job_id"]

    running = await create(alice, "long.ipynb")
    await status_is(hub, tokens[alice], running, "IN_PROGRESS")
    waiting = await create(bob, "quick.ipynb")

    async def first_in_line():
        model = await job(hub, tokens[bob], waiting)
        return model.get("place", {}).get("position") == 1

    await eventually(first_in_line, 20, "bob's job first in line")

    hub.kill(sig)
    await hub.start()
    # the waiting job keeps its place; the running one runs on
    assert (await job(hub, tokens[bob], waiting))["place"]["position"] == 1
    assert (await job(hub, tokens[alice], running))["status"] == "IN_PROGRESS"

    done = await ended(hub, tokens[alice], running, 120)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    assert "slept" in (mine / done["outputs"]["ipynb"]).read_text()
    after = await ended(hub, tokens[bob], waiting, 120)
    assert after["status"] == "COMPLETED", after
    assert await eventually(lambda: _free(hub, 1), 20, "the GPU free at the end")

    async def settled(name):
        got = await entries(ledger_admin, name)
        return got if len(got) >= 3 else None

    for name in (alice, bob):  # one debit and one refund each: nothing charged twice
        await eventually(lambda n=name: settled(n), 30, f"{name} settled")
        await asyncio.sleep(1)  # a second settlement would come within the meter's period
        assert await entries(ledger_admin, name) == [
            ("grant", "10.00"),
            ("debit", "1.00"),
            ("refund", "1.00"),
        ], name


async def test_a_members_jobs_on_one_profile_wait_behind_each_other_and_the_limit_holds(
    gpu_hub, ledger_admin, credits_username, job_runner, docker_client
):
    """Issue 28: ten jobs posted at once by one member, the GPU held by another's server:
    four are created (GPUHUB_JOBS_PER_USER=4), six refused in words; none fails for "already
    in line": the first waits in the line, the others behind it; all four run in turn.
    Her workspace is a Docker volume, as in production: the hub asks the engine where it
    is (a call in a thread), which let all ten past a limit counted before it."""
    hub = await gpu_hub(
        node(GPU_A), PROFILES, "c.Jobs.check_interval = 0.5\n", GPUHUB_JOBS_PER_USER="4"
    )
    alice, bob = members(credits_username, "alice", "bob")
    volume = docker_client.create_volume(hub.workspace(alice))
    home(Path(volume["Mountpoint"]).parent, "_data", {"quick.ipynb": notebook("print('quick')")})
    tokens = await with_credits(hub, ledger_admin, alice, bob)
    await gpu_server(hub, bob)

    posts = await asyncio.gather(
        *(
            hub.api(
                "POST",
                JOBS,
                tokens[alice],
                json={"input_uri": "quick.ipynb", "runtime_environment_name": "gpu"},
            )
            for _ in range(10)
        )
    )
    statuses = sorted(r.status_code for r in posts)
    assert statuses == [201] * 4 + [409] * 6, [r.text for r in posts]
    assert all(
        "each member may have 4" in r.json()["message"] for r in posts if r.status_code == 409
    )
    made = [r.json()["job_id"] for r in posts if r.status_code == 201]

    async def placed():
        models = [await job(hub, tokens[alice], j) for j in made]
        positions = sorted((m.get("place") or {}).get("position") or 0 for m in models)
        return models if positions == [0, 0, 0, 1] else None

    models = await eventually(placed, 20, "one job in line, three behind it")
    assert {m["status"] for m in models} == {"QUEUED"}, models
    behind = [m["place"]["message"] for m in models if not m["place"]["position"]]
    assert (
        behind
        == ["It starts once your job or server before it on the same environment has its GPU."] * 3
    ), behind

    await hub.stop_server(bob)
    for job_id in made:
        done = await ended(hub, tokens[alice], job_id, 180)
        assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    assert await eventually(lambda: _free(hub, 1), 20, "the GPU free at the end")
    assert (await hub.api("GET", f"/users/{alice}")).json()["servers"] == {}


async def test_only_the_jobs_own_server_token_ends_it_and_its_server_goes_with_it(
    gpu_hub, ledger_admin, credits_username, workspaces, docker_client
):
    """Issue 28: a token alice makes herself, with the server token's note and scopes, may
    not report her job's end; a ``.gpuhub-job.json`` she plants does not count either when
    she deletes the job's server through JupyterHub's API: the job FAILED, not COMPLETED,
    and no ``job-…`` server is left in her list.  The ledger names the notebook job."""
    hub = await gpu_hub(
        node(GPU_A), PROFILES, "c.Jobs.check_interval = 0.5\n", **hub_env(workspaces)
    )
    [alice] = members(credits_username, "alice")
    mine = home(workspaces, alice, {"slow.ipynb": notebook("import time\ntime.sleep(600)")})
    [token] = (await with_credits(hub, ledger_admin, alice)).values()

    async def running(name: str) -> dict:
        r = await hub.api(
            "POST",
            JOBS,
            token,
            json={"input_uri": "slow.ipynb", "runtime_environment_name": "gpu", "name": name},
        )
        assert r.status_code == 201, r.text
        return await status_is(hub, token, r.json()["job_id"], "IN_PROGRESS")

    async def all_servers() -> dict:
        r = await hub.api("GET", f"/users/{alice}?include_stopped_servers=1")
        return r.json()["servers"]

    # a planted report, then JupyterHub's DELETE of the job's server
    first = await running("planted")
    server = first["server_name"]
    report = mine / first["output_dir"] / ".gpuhub-job.json"
    report.write_text(json.dumps({"exit_code": 0, "error": ""}))
    os.chown(report, 1000, 100)
    r = await hub.api("DELETE", f"/users/{alice}/servers/{server}", token)
    assert r.status_code in (202, 204), r.text
    failed = await ended(hub, token, first["job_id"], 60)
    assert failed["status"] == "FAILED", failed
    assert "ended without a report" in failed["status_message"], failed

    async def forgotten():
        return server not in await all_servers()

    await eventually(forgotten, 20, "the deleted job's server gone from her list")

    # the debit names the notebook job, not "Server alice/job-…"
    reasons = [t.reason async for t in ledger_admin.iter_transactions(alice) if t.kind == "debit"]
    assert reasons and reasons[-1].startswith(
        f"Notebook job: planted, {alice}/{server} (gpu) at 4 credits/hour"
    ), reasons

    # a token of her own with the server token's note and scopes
    second = await running("forged")
    server = second["server_name"]
    r = await hub.api(
        "POST",
        f"/users/{alice}/tokens",
        token,
        json={
            "note": f"Server at /user/{alice}/{server}/",
            "scopes": [
                "users:activity!user",
                f"access:servers!server={alice}/{server}",
                "custom:gpuhub:jobs!user",
            ],
        },
    )
    assert r.status_code in (200, 201), r.text
    forged = r.json()["token"]
    r = await hub.api("POST", f"{JOBS}/{second['job_id']}/report", forged, json={"exit_code": 0})
    assert r.status_code == 403, r.text
    assert (await job(hub, token, second["job_id"]))["status"] == "IN_PROGRESS"
    r = await hub.api("POST", f"{JOBS}/{second['job_id']}/stop", token)
    assert r.status_code == 204, r.text
    stopped = await ended(hub, token, second["job_id"], 60)
    assert stopped["status"] == "STOPPED", stopped
    await eventually(forgotten, 20, "the stopped job's server gone from her list")
    assert await eventually(lambda: _free(hub, 1), 20, "the GPU free at the end")
