"""GPU notebook jobs when something goes wrong, in one real hub shared by the module: the
Credits API down when a job's turn comes or when it ends, the profile's image gone, the
job's container killed, the hub killed while a job ends or while one waits, hostile
fields in the hub's log (issue 22, "Faults and restarts").

Real parts: JupyterHub and its proxy, Docker, the reference credits service behind
:class:`LedgerFaults` (which refuses connections on demand), the NVML stand-in with one
busy GPU.  The "gpu" profile costs 4 credits per hour: 1.00 per 15-minute interval; the
clock of the credits hook only moves when a test moves it.  The tests run in order and
each leaves the GPU free.
"""

from __future__ import annotations

import asyncio
import json
import signal
from types import SimpleNamespace

import pytest
import pytest_asyncio

from hub_ext.common.logs import ShortLines
from tests.fixtures.credits_faults import LedgerFaults, MovableClock
from tests.fixtures.hub import Hub, eventually
from tests.fixtures.nvml import NVMLNode
from tests.test_jobs_hub import (
    GPU_A,
    GPU_NOTEBOOK,
    JOBS,
    ended,
    entries,
    gpus_free,
    home,
    hub_env,
    job,
    job_runner,  # noqa: F401 - the fixture
    node,
    notebook,
    status_is,
)

pytestmark = [
    pytest.mark.docker,
    pytest.mark.hub,
    pytest.mark.asyncio(loop_scope="module"),
]

GONE = "gpuhub-test/gone-image"
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
    {"display_name": "Free GPU", "slug": "free", "gpus": 1},
    {
        "display_name": "Gone image",
        "slug": "gone",
        "gpus": 1,
        "credits_per_hour": 4,
        "spawner_override": {"image": f"{GONE}:latest"},
    },
]
# a refused Credits API is given up quickly, as in tests/test_credits_hub.py
CONFIG = (
    "c.Jobs.check_interval = 0.5\n"
    "c.Spawner.poll_interval = 1\n"  # a dead container is seen at once
    "c.CreditsClient.timeout = 1\n"
    "c.CreditsClient.max_attempts = 2\n"
    "c.CreditsClient.backoff_base = 0.05\n"
    "c.CreditsHook.spawn_timeout = 3\n"
)
SLEEPY = notebook("import time\ntime.sleep(600)")
SHORT = notebook("import time\ntime.sleep(3)\nprint('done')")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site(
    tmp_path_factory,
    docker_client,
    job_runner,  # noqa: F811 - the fixture imported above
    credits_service,
    nvml_standin_lib,
    oidc_provider,
):
    """The module's hub (one GPU, credits through ``faults``), its clock, the ledger's
    admin client, the workspaces' root and a counter of members."""
    tmp = tmp_path_factory.mktemp("jobfaults")
    faults = LedgerFaults(credits_service.url)
    clock = MovableClock(tmp / "clock")
    gpus = NVMLNode(tmp / "nvml-node.json", nvml_standin_lib)
    gpus.write(node(GPU_A))
    profiles = tmp / "profiles.json"
    profiles.write_text(json.dumps(PROFILES))
    workspaces = tmp / "homes"
    workspaces.mkdir()
    docker_client.tag(job_runner, GONE, "latest")
    (tmp / "hub").mkdir()
    hub = Hub(
        tmp / "hub",
        {
            "GPUHUB_GPUS": "nvml",
            "GPUHUB_PROFILES": str(profiles),
            "GPUHUB_CREDITS_URL": faults.url,
            "GPUHUB_CREDITS_TOKEN": credits_service.hub_token,
            **gpus.env,
            **hub_env(workspaces),
        },
        clock.hub_config("CreditsHook", "Culler")
        + "c.GPUPool.refresh_interval = 0.1\n"
        + "c.Culler.check_interval = 0.2\n"
        + "c.CreditsHook.meter_period = 0.2\n"
        + CONFIG,
        oidc=oidc_provider,
    )
    try:
        await hub.start()
        async with credits_service.client(admin=True) as admin:
            yield SimpleNamespace(
                hub=hub, faults=faults, clock=clock, admin=admin, workspaces=workspaces, n=[0]
            )
    finally:
        print(f"--- last lines of {hub.log_path} ---\n{hub.log()[-8000:]}")
        await hub.close(docker_client)
        faults.close()
        try:
            docker_client.remove_image(f"{GONE}:latest")
        except Exception:  # noqa: BLE001 - removed by the test
            pass


async def member(site, files: dict[str, str], credits: str = "10.00") -> tuple[str, str]:
    """A new member (name, token) with ``files`` in their workspace and ``credits``."""
    site.n[0] += 1
    name = f"m{site.hub.id}{site.n[0]}"
    home(site.workspaces, name, files)
    token = await site.hub.create_user(name)
    if credits:
        await site.admin.grant(name, credits, key=f"test-grant-{name}")
    return name, token


async def create(site, token: str, path: str, profile: str = "gpu") -> str:
    r = await site.hub.api(
        "POST", JOBS, token, json={"input_uri": path, "runtime_environment_name": profile}
    )
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


async def placed(site, token: str, job_id: str, position: int) -> None:
    async def there():
        model = await job(site.hub, token, job_id)
        return model.get("place", {}).get("position") == position

    await eventually(there, 30, f"job {job_id} at place {position}")


async def gpu_free(site) -> None:
    async def free():
        return await gpus_free(site.hub) == 1

    await eventually(free, 30, "the GPU free")


async def settles(site, name: str, expected: list[tuple[str, str]], seconds: float = 1.5):
    """``name``'s ledger reaches ``expected`` and stays there (several meter passes)."""

    async def same():
        return await entries(site.admin, name) == expected

    try:
        await eventually(same, 30, str(expected))
    except AssertionError:
        raise AssertionError(
            f"{await entries(site.admin, name)} != {expected}\n{site.hub.log()[-3000:]}"
        ) from None
    await asyncio.sleep(seconds)
    assert await entries(site.admin, name) == expected


async def holder(site) -> str:
    """A member whose GPU server holds the only GPU."""
    name, _ = await member(site, {})
    r = await site.hub.spawn(name, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await site.hub.wait_ready(name)
    return name


def grant() -> list[tuple[str, str]]:
    return [("grant", "10.00")]


async def test_credits_api_down_when_a_jobs_turn_comes_fails_it_and_the_gpu_goes_on(site):
    hub = site.hub
    bob = await holder(site)
    alice, alices = await member(site, {"a.ipynb": GPU_NOTEBOOK})
    carol, carols = await member(site, {"c.ipynb": SHORT}, credits="")
    paid = await create(site, alices, "a.ipynb")
    await placed(site, alices, paid, 1)
    free = await create(site, carols, "c.ipynb", "free")  # a free profile asks no credits
    await placed(site, carols, free, 2)

    site.faults.set("refused")
    try:
        await hub.stop_server(bob)
        failed = await ended(hub, alices, paid, 60)
        assert failed["status"] == "FAILED", failed
        assert (
            "credit service cannot be reached, so no server or job" in failed["status_message"]
        ), failed
        assert "Traceback" not in failed["status_message"]
        # the GPU went on to the next in line, which runs and ends
        done = await ended(hub, carols, free, 90)
        assert done["status"] == "COMPLETED", done
        assert done["start_time"] >= failed["end_time"]
    finally:
        site.faults.set("forward")
    await settles(site, alice, grant())  # nothing charged
    await gpu_free(site)


async def test_credits_api_down_when_a_job_ends_owes_the_refund_and_pays_it_once(site):
    hub = site.hub
    alice, token = await member(site, {"short.ipynb": SHORT})
    job_id = await create(site, token, "short.ipynb")
    await status_is(hub, token, job_id, "IN_PROGRESS")
    await settles(site, alice, [*grant(), ("debit", "1.00")], 0)

    site.faults.set("refused")
    try:
        done = await ended(hub, token, job_id, 60)
        assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
        await gpu_free(site)
        await asyncio.sleep(1)  # meter passes while the API is down: the refund is owed
        assert await entries(site.admin, alice) == [*grant(), ("debit", "1.00")]
    finally:
        site.faults.set("forward")
    await settles(site, alice, [*grant(), ("debit", "1.00"), ("refund", "1.00")], 3)


async def test_a_profiles_image_gone_fails_the_job_in_words_and_keeps_nothing(site, docker_client):
    alice, token = await member(site, {"a.ipynb": GPU_NOTEBOOK})
    docker_client.remove_image(f"{GONE}:latest")  # the tag only: the image stays
    job_id = await create(site, token, "a.ipynb", "gone")
    failed = await ended(site.hub, token, job_id, 60)
    assert failed["status"] == "FAILED", failed
    assert (
        f"The image {GONE}:latest of this profile is not on this node" in (failed["status_message"])
    ), failed
    await gpu_free(site)
    # debited as the container was made (the credits hook runs first), refunded whole
    await settles(site, alice, [*grant(), ("debit", "1.00"), ("refund", "1.00")])


async def test_a_jobs_container_killed_fails_it_and_refunds_the_unused_part(site, docker_client):
    hub = site.hub
    alice, token = await member(site, {"slow.ipynb": SLEEPY})
    job_id = await create(site, token, "slow.ipynb")
    await status_is(hub, token, job_id, "IN_PROGRESS")
    await settles(site, alice, [*grant(), ("debit", "1.00")], 0)
    site.clock.at(300)  # a third of the interval used
    [box] = [c for c in hub.containers(docker_client) if alice in c["Names"][0]]
    docker_client.kill(box["Id"])
    failed = await ended(hub, token, job_id, 60)
    assert failed["status"] == "FAILED", failed
    assert "container was killed" in failed["status_message"], failed
    await gpu_free(site)
    await settles(site, alice, [*grant(), ("debit", "1.00"), ("refund", "0.66")])


async def test_a_job_that_ends_while_the_hub_is_down_is_settled_once_after_it(site):
    hub = site.hub
    alice, token = await member(site, {"short.ipynb": SHORT})
    job_id = await create(site, token, "short.ipynb")
    running = await status_is(hub, token, job_id, "IN_PROGRESS")
    await settles(site, alice, [*grant(), ("debit", "1.00")], 0)
    hub.kill(signal.SIGKILL)
    report = site.workspaces / alice / running["output_dir"] / ".gpuhub-job.json"

    async def finished():
        return report.exists()

    await eventually(finished, 60, "the job's end while the hub is down")
    await hub.start()
    done = await ended(hub, token, job_id, 60)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    assert "done" in (site.workspaces / alice / done["outputs"]["ipynb"]).read_text()
    await gpu_free(site)
    await settles(site, alice, [*grant(), ("debit", "1.00"), ("refund", "1.00")], 3)


async def test_after_a_restart_a_queued_job_starts_by_itself_when_the_gpu_frees(site):
    hub = site.hub
    bob = await holder(site)
    alice, token = await member(site, {"short.ipynb": SHORT})
    job_id = await create(site, token, "short.ipynb")
    await placed(site, token, job_id, 1)
    hub.kill(signal.SIGKILL)
    await hub.start()
    await hub.stop_server(bob)  # only reads of the job: the hub moves it by itself
    done = await ended(hub, token, job_id, 90)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    await gpu_free(site)


async def test_after_a_restart_a_job_whose_container_vanished_ends_by_itself(site, docker_client):
    hub = site.hub
    alice, token = await member(site, {"slow.ipynb": SLEEPY})
    job_id = await create(site, token, "slow.ipynb")
    await status_is(hub, token, job_id, "IN_PROGRESS")
    hub.kill(signal.SIGKILL)
    [box] = [c for c in hub.containers(docker_client) if alice in c["Names"][0]]
    docker_client.remove_container(box["Id"], force=True)
    await hub.start()  # no request about jobs: the hub ends it by itself
    failed = await ended(hub, token, job_id, 30)
    assert failed["status"] == "FAILED", failed
    assert "ended without a report" in failed["status_message"], failed
    await gpu_free(site)
    await settles(site, alice, [*grant(), ("debit", "1.00"), ("refund", "1.00")])


async def test_hostile_job_fields_leave_no_line_of_the_hub_log_over_its_limit(site):
    hub = site.hub
    alice, token = await member(site, {"a.ipynb": GPU_NOTEBOOK})
    long = "x" * 10_000
    bodies = [
        {"input_uri": long + ".ipynb", "runtime_environment_name": "gpu"},
        {"input_uri": "a.ipynb", "runtime_environment_name": long},
        {"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "name": long},
        {"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "parameters": {long: "1"}},
        {"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "parameters": {"n": long}},
        {"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "idempotency_token": long},
        {"input_uri": "a/" * 500 + "a.ipynb", "runtime_environment_name": "gpu"},
    ]
    for body in bodies:
        r = await hub.api("POST", JOBS, token, json=body)
        assert 400 <= r.status_code < 500, r.text
    # each parameter within its limit, all of them more than a start's options take
    many = {f"p{i}": "v" * 1000 for i in range(20)}
    r = await hub.api(
        "POST",
        JOBS,
        token,
        json={"input_uri": "a.ipynb", "runtime_environment_name": "gpu", "parameters": many},
    )
    assert r.status_code == 413 and "parameters" in r.json()["message"], r.text
    for content in (b"[" * 200_000, b"[" + b"1," * 120_000 + b"1]", b"x" * 300_000):
        r = await hub.api("POST", JOBS, token, content=content)
        assert 400 <= r.status_code < 500, r.text[:300]
    r = await hub.api("POST", JOBS, token, content=b"x" * 2**21)  # over the hub's limit:
    assert r.status_code in (400, 413, 503)  # its connection closed before it is read
    r = await hub.api("GET", f"{JOBS}?name={long}&status={long}", token)
    assert r.status_code < 500
    assert (await hub.api("GET", f"/users/{alice}", None)).json()["servers"] == {}
    # the record's limit, the cut's note and the line's prefix (level, time, logger)
    most = ShortLines().most + len("… (cut: 1000000 characters in all)") + 200
    longest = max(hub.log().splitlines(), key=len)
    assert len(longest) <= most, longest[:300]
    assert long[:100] not in hub.log()  # no field echoed whole (quoted: 40 characters)
