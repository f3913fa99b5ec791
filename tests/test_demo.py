"""The README's first command, ``scripts/demo.sh``, serves a hub people can sign in to.

The demo is run as a person runs it (its own OIDC provider, its own credits service,
simulated GPUs where NVML finds no driver, the shipped profiles), on ports and a hub id of
its own so that it never meets another hub; on Slurm, on this checkout's own test cluster
(the ``GPUHUB_SLURM_*`` variables of tests/fixtures/slurm.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import httpx
import pytest
from jupyterhub.utils import random_port

from hub_ext.config import DEFAULT_PROFILES
from hub_ext.spawn.profiles import init_profiles, jobs_allowed
from tests.fixtures.hub import REPO, until_ready
from tests.fixtures.oidc import begin_login, oidc_login
from tests.fixtures.probes import CONNECT
from tests.test_container import exec_in
from tests.test_jobs_hub import notebook

#: which cluster scripts/slurm-cluster.sh starts: this checkout's own, never the default
CLUSTER = ("GPUHUB_SLURM_DIR", "GPUHUB_SLURM_SUBNET", "GPUHUB_SLURM_PORT", "GPUHUB_SLURM_BRIDGE")
CLUSTER += ("GPUHUB_SLURM_NS_PREFIX", "GPUHUB_SLURM_VETH", "GPUHUB_SLURM_NODES")

pytestmark = [pytest.mark.docker, pytest.mark.hub]


@pytest.fixture
async def demo(tmp_path, docker_client, notebook_image):
    async for running in run_demo(tmp_path, docker_client):
        yield running


async def run_demo(tmp_path, docker_client, *args: str, **settings: str):
    """``scripts/demo.sh ARGS`` as a person runs it, on ports and names of its own (its
    members' network too: :func:`demo_network`), with ``settings`` added to its
    environment; yields what a test needs of it once its hub answers, and stops it
    afterwards (its network removed)."""
    hub_id = "d" + secrets.token_hex(4)
    port = random_port()
    network = demo_network()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "JUPYTERHUB_"))},
        **{k: os.environ[k] for k in CLUSTER if k in os.environ},
        **network,
        "GPUHUB_PORT": str(port),
        "GPUHUB_HUB_PORT": str(random_port()),
        "GPUHUB_PROXY_API_PORT": str(random_port()),
        "GPUHUB_CREDITS_PORT": str(random_port()),
        "GPUHUB_DEMO_OIDC_PORT": str(random_port()),
        "GPUHUB_STATE_DIR": str(tmp_path / "var"),
        # demo.sh names the containers and workspaces after it
        "GPUHUB_HUB_ID": hub_id,
        **settings,
    }
    log = open(tmp_path / "demo.log", "wb")
    proc = subprocess.Popen(
        ["bash", "scripts/demo.sh", *args],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # setup.sh first: quick when all is there
        async with httpx.AsyncClient() as client:
            while True:
                assert proc.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
                try:
                    if (await client.get(url + "/hub/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, (tmp_path / "demo.log").read_text()[-3000:]
                await asyncio.sleep(0.5)
        yield SimpleNamespace(
            url=url,
            log=tmp_path / "demo.log",
            env=env,
            oidc_port=env["GPUHUB_DEMO_OIDC_PORT"],
            secret=printed_secret(tmp_path / "demo.log"),
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-f", str(tmp_path / "var")], check=False)
        for c in docker_client.containers(all=True, filters={"label": f"io.gpuhub.hub={hub_id}"}):
            docker_client.remove_container(c["Id"], force=True)
        for volume in docker_client.volumes(filters={"name": hub_id})["Volumes"] or []:
            docker_client.remove_volume(volume["Name"])
        remove_demo_network(network)
        log.close()


def demo_network() -> dict[str, str]:
    """The demo's members' network for this checkout's tests: the /24 128 above the hub
    tests' (``GPUHUB_TEST_SUBNET``, tests/fixtures/network.py), so that two checkouts'
    demos never share one."""
    a, b, c = os.environ.get("GPUHUB_TEST_SUBNET", "10.216.0").split(".")
    subnet = f"{a}.{b}.{(int(c) + 128) % 256}"
    return {
        "GPUHUB_DEMO_SUBNET": subnet,
        "GPUHUB_DEMO_NETWORK": "gpuhub-demo-" + subnet.replace(".", "-"),
    }


def remove_demo_network(network: dict[str, str]) -> None:
    """``deploy/network/gpuhub-network.sh remove`` for the network demo.sh made."""
    subnet = network["GPUHUB_DEMO_SUBNET"]
    env = {
        **os.environ,
        "GPUHUB_NETWORK": network["GPUHUB_DEMO_NETWORK"],
        "GPUHUB_NETWORK_SUBNET": f"{subnet}.0/24",
        "GPUHUB_NETWORK_BRIDGE": "ghd-" + "-".join(subnet.split(".")[1:]),
    }
    script = REPO / "deploy" / "network" / "gpuhub-network.sh"
    subprocess.run(["bash", str(script), "remove"], env=env, capture_output=True, check=False)


def printed_secret(log) -> str:
    """The demo login's password, as demo.sh prints it on its console."""
    match = re.search(r"asks for a password \(any user name\): (\S+)", log.read_text())
    assert match, log.read_text()[-3000:]
    return match.group(1)


async def test_the_readme_demo_serves_a_hub_members_sign_in_to(demo):
    url, log = demo.url, demo.log
    async with httpx.AsyncClient(timeout=30) as alice:
        r = await oidc_login(alice, url, "alice", provider_auth=("alice", demo.secret))
        assert r.status_code == 302, r.text
        page = await alice.get(url + "/hub/spawn", follow_redirects=True)
        assert page.status_code == 200
        assert "(simulated GPUs)" in page.text  # labelled where NVML finds no driver
        assert "10.00 credits" in page.text  # the demo's initial grant
    async with httpx.AsyncClient(timeout=30) as mallory:
        r = await oidc_login(mallory, url, "mallory", provider_auth=("m", demo.secret))
        assert r.status_code == 403
        assert "Not a member of this hub" in r.text
    assert "SIMULATED node of 2 GPUs" in log.read_text()


@pytest.mark.slurm
async def test_the_readme_demo_on_slurm_shows_the_clusters_free_gpus(
    tmp_path, docker_client, notebook_image, slurm_cluster
):
    async for demo in run_demo(tmp_path, docker_client, "--backend", "slurm"):
        async with httpx.AsyncClient(timeout=30) as alice:
            r = await oidc_login(alice, demo.url, "alice", provider_auth=("alice", demo.secret))
            assert r.status_code == 302, r.text
            page = await alice.get(demo.url + "/hub/spawn", follow_redirects=True)
            assert page.status_code == 200
            assert re.search(r"\d of 4 GPUs free now", page.text)  # two nodes, two each
            assert "(simulated GPUs)" not in page.text  # Slurm's own GPUs, not the pool's
            model = (await alice.get(demo.url + "/hub/api/gpuhub/availability")).json()
            assert (model["inventory"], model["total"]) == ("slurm", 4)


async def test_gpuhub_credits_finds_the_demos_own_credits_service(demo):
    async with httpx.AsyncClient(timeout=30) as bob:
        r = await oidc_login(bob, demo.url, "bob", provider_auth=("bob", demo.secret))
        assert r.status_code == 302  # 10 credits
    # an operator on the hub's machine, with the hub's settings and nothing else
    env = {**demo.env, "GPUHUB_CREDITS_URL": ""}
    gpuhub = [str(REPO / ".venv" / "bin" / "gpuhub"), "credits"]
    out = subprocess.run(
        [*gpuhub, "grant", "bob", "5"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "Granted 5.00 credits to bob. Balance: 15.00" in out
    out = subprocess.run(
        [*gpuhub, "balance", "bob"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "bob: 15.00 credits"


async def test_the_readme_demos_course_is_run_by_its_instructor(demo):
    """The demo ships ML101 (``deploy/demo/courses.json``): carol, a person on the demo
    provider's page, is its instructor and bob its student, and its account has credits. She
    lists her course, grants bob course credits and reserves a GPU for it."""
    async with httpx.AsyncClient(timeout=30) as person:
        authorize_url = await begin_login(person, demo.url)
        page = await person.get(authorize_url, auth=("carol", demo.secret))
        assert 'value="carol"' in page.text  # a button among the provider's people
    async with httpx.AsyncClient(timeout=30) as bob:
        r = await oidc_login(bob, demo.url, "bob", provider_auth=("bob", demo.secret))
        assert r.status_code == 302, r.text
    async with httpx.AsyncClient(base_url=demo.url, timeout=30) as carol:
        r = await oidc_login(carol, demo.url, "carol", provider_auth=("carol", demo.secret))
        assert r.status_code == 302, r.text  # her instructors' group may sign in
        await carol.get("/hub/home")  # sets the _xsrf cookie
        xsrf = {"X-XSRFToken": next(c.value for c in carol.cookies.jar if c.name == "_xsrf")}
        r = await carol.get("/hub/api/users", headers=xsrf)
        assert r.status_code == 200, r.text
        assert [u["name"] for u in r.json()] == ["bob"]  # her course, no one else
        grant = {"user": "bob", "amount": "5", "reason": "lab 1", "request_id": "demo-lab-1"}
        deadline = time.monotonic() + 120  # demo.sh funds the account once the hub answers
        while True:
            r = await carol.post("/hub/api/gpuhub/courses/ml101/grants", json=grant, headers=xsrf)
            if r.status_code == 201 or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        assert r.status_code == 201, r.text
        assert r.json()["course_balance"] == "95.00"
        tomorrow = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(1)
        lab = {
            "group": "ml101",
            "gpus": 1,
            "start": tomorrow.isoformat(),
            "end": (tomorrow + timedelta(hours=1)).isoformat(),
            "note": "ML101 lab",
        }
        r = await carol.post("/hub/api/gpuhub/reservations", json=lab, headers=xsrf)
        assert r.status_code == 201, r.text
        page = await carol.get("/hub/reservations")
        assert page.status_code == 200 and "ML101" in page.text
    env = {**demo.env, "GPUHUB_CREDITS_URL": ""}
    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "gpuhub"), "credits", "balance", "bob"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "bob: 15.00 credits"


#: Run inside alice's container: the demo's login flow as admin, as code in her terminal
#: would try it (with host networking the hub and the provider are on its loopback too).
SIGN_IN_AS_ADMIN = """
import sys, urllib.error, urllib.request
hub, provider = sys.argv[1], sys.argv[2]
class Keep(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None
opener = urllib.request.build_opener(Keep, urllib.request.HTTPCookieProcessor())
def call(request):
    try:
        answer = opener.open(request, timeout=10)
    except urllib.error.HTTPError as e:
        answer = e
    return answer.status, answer.headers
authorize = call(hub + "/hub/oauth_login")[1]["Location"]
print("authorize", call(authorize)[0])
print("pick", call(urllib.request.Request(authorize, data=b"sub=admin"))[0])
print("claims", call(urllib.request.Request(provider + "/users/admin", method="PUT",
      data=b'{"groups": ["hub-admins"]}', headers={"Content-Type": "application/json"}))[0])
print("home", call(provider + "/")[0])
"""


async def alices_container(demo, docker_client) -> str:
    """alice signs in at the demo and starts a CPU server; its container's id."""
    async with httpx.AsyncClient(timeout=30, follow_redirects=True) as alice:
        r = await oidc_login(alice, demo.url, "alice", provider_auth=("alice", demo.secret))
        assert r.status_code == 302, r.text
        await alice.get(demo.url + "/hub/home")  # sets the _xsrf cookie
        xsrf = next(c.value for c in alice.cookies.jar if c.name == "_xsrf")
        api = f"{demo.url}/hub/api/users/alice"
        r = await alice.post(
            api + "/server", json={"profile": "cpu"}, headers={"X-XSRFToken": xsrf}
        )
        assert r.status_code in (201, 202), r.text
        deadline = time.monotonic() + 120
        while (
            not (await alice.get(api, headers={"X-XSRFToken": xsrf}))
            .json()["servers"]
            .get("", {})
            .get("ready")
        ):
            assert time.monotonic() < deadline, demo.log.read_text()[-3000:]
            await asyncio.sleep(0.5)
    [container] = docker_client.containers(
        filters={"label": f"io.gpuhub.hub={demo.env['GPUHUB_HUB_ID']}"}
    )
    return container["Id"]


async def test_a_members_container_reaches_only_the_hub_api_on_the_demos_machine(
    demo, docker_client
):
    # the demo's members' network (deploy/network/gpuhub-network.sh): a server of its own
    # loopback reaches the hub API on the bridge's gateway and no other service of the
    # machine, on the gateway or loopback (issue 28: the identity provider's :9400)
    container = await alices_container(demo, docker_client)
    gateway = demo.env["GPUHUB_DEMO_SUBNET"] + ".1"
    service = socket.create_server(("0.0.0.0", 0))  # a service of the host, every address
    try:
        others = [
            f"{host}:{port}"
            for host in ("127.0.0.1", gateway)
            for port in (
                service.getsockname()[1],
                demo.oidc_port,
                demo.env["GPUHUB_PORT"],
                demo.env["GPUHUB_CREDITS_PORT"],
            )
        ]
        hub_api = f"{gateway}:{demo.env['GPUHUB_HUB_PORT']}"
        code, out = exec_in(docker_client, container, "python3", "-c", CONNECT, hub_api, *others)
    finally:
        service.close()
    assert code == 0, out
    reached = dict(line.split() for line in out.splitlines())
    assert reached.pop(hub_api) == "open", out
    assert set(reached.values()) == {"ECONNREFUSED"}, out


async def test_code_in_a_members_container_cannot_sign_in_at_the_demo_provider(
    tmp_path, docker_client, notebook_image
):
    # with host networking (GPUHUB_DOCKER_NETWORK=host) the container shares the loopback
    # of the hub and the provider: the provider's printed password still keeps admin safe
    async for demo in run_demo(tmp_path, docker_client, GPUHUB_DOCKER_NETWORK="host"):
        container = await alices_container(demo, docker_client)
        provider = f"http://127.0.0.1:{demo.oidc_port}"
        code, out = exec_in(
            docker_client, container, "python3", "-c", SIGN_IN_AS_ADMIN, demo.url, provider
        )
        assert code == 0, out
        assert out.split() == ["authorize", "401", "pick", "401", "claims", "401", "home", "401"]

        # the same flow with the printed secret is how a person signs in as admin
        async with httpx.AsyncClient(timeout=30) as person:
            authorize_url = await begin_login(person, demo.url)
            r = await person.get(authorize_url)
            assert r.status_code == 401 and "printed on the demo's console" in r.text
            r = await oidc_login(person, demo.url, "admin", provider_auth=("admin", demo.secret))
            assert r.status_code == 302, r.text


# -- every shipped profile, as a server and as a job ----------------------------------------


class DemoMember:
    """A person signed in at the demo's provider, with an API token of theirs."""

    def __init__(self, demo, name: str):
        self.demo, self.name = demo, name
        self.client = httpx.AsyncClient(base_url=demo.url, timeout=60)
        self.token = ""

    async def sign_in(self) -> DemoMember:
        r = await oidc_login(
            self.client, self.demo.url, self.name, provider_auth=(self.name, self.demo.secret)
        )
        assert r.status_code == 302, r.text
        await self.client.get("/hub/home")  # sets the _xsrf cookie
        xsrf = next(c.value for c in self.client.cookies.jar if c.name == "_xsrf")
        r = await self.client.post(
            f"/hub/api/users/{self.name}/tokens",
            json={"note": "demo test"},
            headers={"X-XSRFToken": xsrf},
        )
        assert r.status_code in (200, 201), r.text
        self.token = r.json()["token"]
        return self

    async def api(self, method: str, path: str, **kw) -> httpx.Response:
        headers = {"Authorization": f"token {self.token}"}
        return await self.client.request(method, "/hub/api" + path, headers=headers, **kw)

    async def spawn(self, profile: str, server: str = "") -> None:
        r = await self.api(
            "POST", f"/users/{self.name}/servers/{server}", json={"profile": profile}
        )
        assert r.status_code in (201, 202), f"{self.name}/{server} ({profile}): {r.text}"

    async def ready(self, server: str = "", timeout: float = 300) -> None:
        async def model():
            return (await self.api("GET", f"/users/{self.name}")).json()["servers"].get(server)

        await until_ready(model, f"{self.name}/{server}", self.demo.log.read_text, timeout, 0.5)

    async def stop(self, server: str = "") -> None:
        r = await self.api("DELETE", f"/users/{self.name}/servers/{server}")
        assert r.status_code in (202, 204), r.text

    async def put_notebook(self, path: str, text: str) -> None:
        """Save a notebook at ``path`` in the workspace (``~/work`` in the server) through
        the member's running default server."""
        r = await self.client.put(
            f"/user/{self.name}/api/contents/work/{path}",
            json={"type": "notebook", "format": "json", "content": json.loads(text)},
            headers={"Authorization": f"token {self.token}"},
        )
        assert r.status_code in (200, 201), r.text

    async def job(self, path: str, profile: str, timeout: float = 300) -> dict:
        """Run the notebook at ``path`` as a notebook job on ``profile``; its model once
        it ended."""
        r = await self.api(
            "POST",
            "/gpuhub/jobs",
            json={"input_uri": path, "runtime_environment_name": profile},
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        deadline = time.monotonic() + timeout
        while True:
            model = (await self.api("GET", f"/gpuhub/jobs/{job_id}")).json()
            if model["status"] in ("COMPLETED", "FAILED", "STOPPED"):
                return model
            assert time.monotonic() < deadline, (model, self.demo.log.read_text()[-3000:])
            await asyncio.sleep(1)

    async def close(self) -> None:
        await self.client.aclose()


SHIPPED = init_profiles(DEFAULT_PROFILES)
JOB_NOTEBOOK = notebook("print('demo job:', 6 * 7)")


async def every_profile_as_a_server_and_a_job(demo) -> DemoMember:
    """alice starts each shipped profile as her default server, and runs the demo's
    notebook as a job on each profile that runs jobs, beside her running server; returns
    her, her server stopped."""
    alice = await DemoMember(demo, "alice").sign_in()
    for profile in SHIPPED:
        await alice.spawn(profile["slug"])
        await alice.ready()
        await alice.put_notebook("demo-job.ipynb", JOB_NOTEBOOK)
        if jobs_allowed(profile):
            done = await alice.job("demo-job.ipynb", profile["slug"])
            assert done["status"] == "COMPLETED", done
        await alice.stop()
        await asyncio.sleep(1)
    assert any(jobs_allowed(p) for p in SHIPPED)  # the demo shows notebook jobs
    return alice


async def test_the_readme_demo_starts_every_shipped_profile_as_a_server_and_a_job(
    demo, docker_client
):
    alice = await every_profile_as_a_server_and_a_job(demo)
    # the demo's own names: production's (jupyter-<name>, jupyterhub-user-<name>) are not
    # the demo's, so a production hub never takes the demo alice's workspace
    hub_id = demo.env["GPUHUB_HUB_ID"]
    await alice.spawn("cpu")
    await alice.ready()
    [container] = docker_client.containers(filters={"label": f"io.gpuhub.hub={hub_id}"})
    assert container["Names"] == [f"/{hub_id}-jupyter-alice"]
    assert {m["Name"] for m in container["Mounts"] if m["Type"] == "volume"} == {
        f"{hub_id}-user-alice"
    }
    await alice.close()


@pytest.mark.slurm
async def test_the_readme_demo_on_slurm_starts_every_profile_and_fills_every_gpu(
    tmp_path, docker_client, notebook_image, slurm_cluster
):
    """Every shipped profile as a server and a job; then every GPU of the cluster taken
    by a GPU server, and CPU servers beside them, all at once."""
    async for demo in run_demo(tmp_path, docker_client, "--backend", "slurm"):
        people = []
        try:
            people.append(await every_profile_as_a_server_and_a_job(demo))
            people += [await DemoMember(demo, n).sign_in() for n in ("bob", "admin")]
            alice, bob, admin = people
            servers = [
                (alice, "", "pytorch"),
                (alice, "second", "pytorch"),
                (bob, "", "pytorch"),
                (bob, "second", "pytorch"),
                (admin, "", "cpu"),
                (admin, "second", "cpu"),
            ]
            for person, server, profile in servers:
                await person.spawn(profile, server)
            for person, server, _ in servers:
                await person.ready(server)
            model = (await alice.api("GET", "/gpuhub/availability")).json()
            assert (model["total"], model["free"]) == (4, 0), model
        finally:
            for person in people:
                await person.close()
            for name in ("alice", "bob", "admin"):
                slurm_cluster.run("scancel", "-u", name, check=False)
