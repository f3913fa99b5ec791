"""The production stack of ``docker-compose.yml`` on this machine, for the ``compose`` tier.

Real parts throughout: Debian's docker-compose 1.29, the Docker engine, the images the
compose file names (``gpuhub/hub:latest`` built from this tree, and ``postgres:15-bookworm``,
which here is the stand-in of ``tests/standins/postgres``: no registry answers), JupyterHub
with its proxy serving HTTPS, the reference credits service, PostgreSQL, and the session's
OpenID provider (``tests/fixtures/oidc.py``) on loopback.

A :class:`Stack` is laid out the way an admin's clone is: a project folder holding links to
``docker-compose.yml`` and ``deploy/``, the ``.env`` that ``gpuhub init`` writes (plus the
site settings a test adds: its OpenID provider, simulated GPUs), and ``tls/`` with a
self-signed certificate.  ``tests/compose/docker-compose.test.yml`` puts every service on
host networking with free loopback ports; ``tests/compose/test_compose_network.py`` keeps the
production network instead (``docker-compose.bridge.yml``).
Each stack has its own compose project name, so volumes, containers, member containers
(``GPUHUB_HUB_ID``) and workspaces never meet another test run's.

Fixtures: ``compose_images`` (session; builds what is missing or stale with
``scripts/build-images.sh hub postgres``), ``stack`` (module; one bring-up shared by the
tests of a module, which run in order) and ``hub`` (per test: an HTTPS client of the stack).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import docker
import httpx
import pytest
from jupyterhub.utils import random_port

from hub_ext.credits.client import CreditsClient
from hub_ext.ops.deploy import SECRETS
from tests.fixtures.hub import _need, until_ready
from tests.fixtures.oidc import ADMINS, MEMBERS, OIDCProvider, oidc_login
from tests.fixtures.tls import self_signed

REPO = Path(__file__).resolve().parents[2]
OVERRIDE = Path(__file__).with_name("docker-compose.test.yml")
HUB_UID = 990  # images/hub/Dockerfile
#: the hub's image the stacks run (hub, credits, check, upgrade): this tree's, as
#: scripts/build-images.sh names it under GPUHUB_IMAGE_NAMESPACE (default gpuhub, the name
#: docker-compose.yml has), passed to the override as GPUHUB_TEST_HUB_IMAGE
HUB_IMAGE = f"{os.environ.get('GPUHUB_IMAGE_NAMESPACE') or 'gpuhub'}/hub:latest"
PORTS = (
    "GPUHUB_TEST_PORT",
    "GPUHUB_TEST_HUB_PORT",
    "GPUHUB_TEST_PROXY_API_PORT",
    "GPUHUB_TEST_POSTGRES_PORT",
    "GPUHUB_TEST_CREDITS_PORT",
)


def docker_compose() -> str:
    path = shutil.which("docker-compose")
    _need(path is not None, "docker-compose is not installed (scripts/setup.sh installs it)")
    return path


@pytest.fixture(scope="session")
def compose_images(docker_client, tmp_path_factory) -> None:
    """The images docker-compose.yml names, current with this tree (the hub's as
    :data:`HUB_IMAGE`).

    ``scripts/build-images.sh hub postgres`` keeps an image whose inputs are unchanged, so
    after scripts/setup.sh this only checks fingerprints.
    """
    docker_compose()
    log = tmp_path_factory.mktemp("images") / "build-images.log"
    with open(log, "wb") as out:
        rc = subprocess.run(
            ["bash", str(REPO / "scripts" / "build-images.sh"), "hub", "postgres"],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1800,
        ).returncode
    if rc != 0:
        pytest.fail(f"scripts/build-images.sh hub postgres failed:\n{log.read_text()[-4000:]}")


def make_certificate(folder: Path) -> Path:
    """``folder``/cert.pem and key.pem: a fresh self-signed certificate for 127.0.0.1, the
    key owned by the hub's user, mode 600."""
    return self_signed(folder, owner=HUB_UID)


class Stack:
    """One compose project of the production file with the test override."""

    def __init__(self, root: Path, oidc: OIDCProvider):
        self.oidc = oidc
        self.name = "gpuhubt" + secrets.token_hex(4)
        self.dir = root / "project"
        self.dir.mkdir()
        (self.dir / "docker-compose.yml").symlink_to(REPO / "docker-compose.yml")
        (self.dir / "deploy").symlink_to(REPO / "deploy")
        self.env_file = self.dir / ".env"
        self.cert = self.dir / "tls" / "cert.pem"
        self.ports = {name: str(random_port()) for name in PORTS}
        self.url = f"https://127.0.0.1:{self.ports['GPUHUB_TEST_PORT']}"
        self.credits_url = f"http://127.0.0.1:{self.ports['GPUHUB_TEST_CREDITS_PORT']}"
        self.pg_port = int(self.ports["GPUHUB_TEST_POSTGRES_PORT"])
        self.saved_logs: list[str] = []
        #: the test override and the variables it reads (besides the ports)
        self.override = OVERRIDE
        self.override_env = {"GPUHUB_TEST_HUB_IMAGE": HUB_IMAGE}

    # -- set-up, as docs/tutorial/first-hub.md says -----------------------------------------

    def init(self) -> None:
        """``gpuhub init``, then the site settings a test deployment adds to .env."""
        r = subprocess.run(
            [sys.executable, "-m", "hub_ext.cli", "init", "--env-file", str(self.env_file)],
            capture_output=True,
            text=True,
            cwd=self.dir,
        )
        assert r.returncode == 0, r.stderr
        self.set_env(
            GPUHUB_OIDC_ISSUER=self.oidc.url,
            GPUHUB_OIDC_CLIENT_ID=f"gpuhub-{self.name}",
            GPUHUB_OIDC_CLIENT_SECRET=secrets.token_hex(16),
            GPUHUB_ALLOWED_GROUPS=MEMBERS,
            GPUHUB_ADMIN_GROUPS=ADMINS,
            GPUHUB_ADMIN_CONTACT="hub-admins@example.org",
            GPUHUB_INITIAL_CREDITS="10",
            GPUHUB_GPUS="simulated:2",
            GPUHUB_CONTAINER_PREFIX=f"{self.name}-jupyter",
            GPUHUB_HUB_ID=self.name,
            GPUHUB_WORKSPACE=f"{self.name}-user-{{username}}",
        )
        self.make_tls()

    def set_env(self, **values: str) -> None:
        """Set ``KEY=value`` lines of .env in place (its mode stays)."""
        lines = self.env_file.read_text().splitlines()
        for key, value in values.items():
            line = f"{key}={value}"
            for i, old in enumerate(lines):
                if old.startswith(key + "="):
                    lines[i] = line
                    break
            else:
                lines.append(line)
        with open(self.env_file, "r+") as f:
            f.truncate()
            f.write("\n".join(lines) + "\n")

    def env(self) -> dict[str, str]:
        """The KEY=value lines of .env."""
        pairs = (
            line.split("=", 1)
            for line in self.env_file.read_text().splitlines()
            if "=" in line and not line.startswith("#")
        )
        return dict(pairs)

    def secrets(self) -> dict[str, str]:
        """The secrets ``gpuhub init`` wrote, by variable."""
        env = self.env()
        return {name: env[name] for name in SECRETS}

    def make_tls(self) -> None:
        """A self-signed certificate for 127.0.0.1, the key given to the hub's user."""
        make_certificate(self.cert.parent)

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts this stack's certificate (and nothing else)."""
        return ssl.create_default_context(cafile=str(self.cert))

    # -- docker-compose --------------------------------------------------------------------

    def compose(
        self, *args: str, check: bool = True, timeout: float = 300, stdin=None
    ) -> subprocess.CompletedProcess:
        """``docker-compose`` on this project (production file + test override)."""
        cmd = [
            docker_compose(),
            "--no-ansi",
            "-p",
            self.name,
            "--project-directory",
            str(self.dir),
            "-f",
            str(self.dir / "docker-compose.yml"),
            "-f",
            str(self.override),
            *args,
        ]
        r = subprocess.run(
            cmd, env=self.compose_env(), stdin=stdin, capture_output=True, timeout=timeout
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} failed ({r.returncode}):\n"
                f"{r.stderr.decode(errors='replace')[-3000:]}\n{self.logs()[-3000:]}"
            )
        return r

    def compose_env(self) -> dict[str, str]:
        """The environment docker-compose runs with: the test's ports and hub image."""
        return {**os.environ, **self.ports, **self.override_env}

    def shell(self, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``bash -c script`` in the project folder, where a plain ``docker-compose``
        (as the docs write it) runs on this stack (COMPOSE_PROJECT_NAME, COMPOSE_FILE)."""
        env = {
            **self.compose_env(),
            "COMPOSE_PROJECT_NAME": self.name,
            "COMPOSE_FILE": f"{self.dir / 'docker-compose.yml'}:{self.override}",
            "COMPOSE_INTERACTIVE_NO_CLI": "1",
        }
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def up(self, *services: str) -> None:
        """``up -d``; then wait for the hub (all services) or for PostgreSQL."""
        self.compose("up", "-d", *services)
        if not services or "hub" in services:
            self.wait_ready()
        else:
            self.wait_healthy("postgres")

    def wait_healthy(self, service: str, timeout: float = 120) -> None:
        """Until the service's healthcheck passes."""
        deadline = time.monotonic() + timeout
        while self.container(service)["State"]["Health"]["Status"] != "healthy":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{service} not healthy:\n{self.logs(service)[-3000:]}")
            time.sleep(0.5)

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the hub answers over HTTPS and the credits service answers at all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                hub = httpx.get(self.url + "/hub/api/", verify=self.ssl_context(), timeout=5)
                # the credits service, where this machine reaches it (host networking)
                credits = httpx.get(self.credits_url + "/", timeout=5) if self.credits_url else None
                if hub.status_code == 200 and (credits is None or credits.status_code == 404):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the stack did not answer in {timeout}s:\n{self.logs()[-4000:]}")

    def logs(self, *services: str) -> str:
        r = self.compose("logs", "--no-color", *services, check=False)
        return r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")

    def save_logs(self) -> None:
        """Keep the logs of this project's containers before `down` removes them."""
        self.saved_logs.append(self.logs())

    def container(self, service: str) -> dict:
        """``docker inspect`` of the service's container."""
        cid = self.compose("ps", "-q", service).stdout.decode().strip()
        assert cid, f"no container for {service}"
        return docker.APIClient().inspect_container(cid)

    def members(self, client) -> list[dict]:
        """The members' server containers this hub made."""
        return client.containers(all=True, filters={"label": f"io.gpuhub.hub={self.name}"})

    def close(self, client) -> None:
        self.compose("down", "-v", "--remove-orphans", "-t", "10", check=False)
        for c in self.members(client):
            client.remove_container(c["Id"], force=True)
        for volume in client.volumes(filters={"name": f"{self.name}-user-"})["Volumes"] or []:
            client.remove_volume(volume["Name"], force=True)

    # -- what the test talks to ------------------------------------------------------------

    def credits(self) -> CreditsClient:
        """A client of the credits service with the admin token from .env."""
        return CreditsClient(url=self.credits_url, token=self.env()["GPUHUB_CREDITS_ADMIN_TOKEN"])


class HubClient:
    """An HTTPS client of one stack's hub; enough of ``tests.fixtures.hub.Hub`` for its helpers
    (``url``, ``client``, ``ssl_context``)."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.url = stack.url
        self.ssl_context = stack.ssl_context()
        self.client = httpx.AsyncClient(base_url=self.url, verify=self.ssl_context, timeout=30)
        self._clients = [self.client]

    async def login(self, name: str, groups=(MEMBERS,)) -> str:
        """Log ``name`` in through the OpenID provider, as a browser does; returns an API
        token of theirs, made with their login cookie."""
        self.stack.oidc.member(name, list(groups))
        browser = httpx.AsyncClient(base_url=self.url, verify=self.ssl_context, timeout=30)
        self._clients.append(browser)
        r = await oidc_login(browser, self.url, name)
        assert r.status_code == 302, (r.status_code, r.text[:1000])
        r = await browser.get(r.headers["location"], follow_redirects=True)
        assert r.status_code == 200 and "/hub/login" not in str(r.url), (r.status_code, r.url)
        xsrf = next(c.value for c in browser.cookies.jar if c.name == "_xsrf")
        r = await browser.post(
            f"/hub/api/users/{name}/tokens",
            json={"note": "compose test"},
            headers={"X-XSRFToken": xsrf},
        )
        assert r.status_code in (200, 201), r.text
        return r.json()["token"]

    async def api(self, method: str, path: str, token: str, **kw) -> httpx.Response:
        return await self.client.request(
            method, "/hub/api" + path, headers={"Authorization": f"token {token}"}, **kw
        )

    async def spawn(self, name: str, token: str, profile: str) -> httpx.Response:
        return await self.api("POST", f"/users/{name}/server", token, json={"profile": profile})

    async def wait_ready(self, name: str, token: str, timeout: float = 120) -> dict:
        async def model():
            return (await self.api("GET", f"/users/{name}", token)).json()["servers"].get("")

        return await until_ready(
            model, f"{name}'s server", lambda: self.stack.logs("hub"), timeout, 0.2
        )

    async def stop(self, name: str, token: str, timeout: float = 60) -> None:
        r = await self.api("DELETE", f"/users/{name}/server", token)
        assert r.status_code in (202, 204), r.text
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = (await self.api("GET", f"/users/{name}", token)).json()["servers"].get("")
            if not model:
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{name}'s server did not stop in {timeout}s")

    async def availability(self, token: str) -> dict:
        r = await self.api("GET", "/gpuhub/availability", token)
        assert r.status_code == 200, r.text
        return r.json()

    async def close(self) -> None:
        for c in self._clients:
            await c.aclose()


@pytest.fixture(scope="module")
def stack(compose_images, docker_client, oidc_provider, tmp_path_factory):
    """One running stack for the tests of a module (they run in file order and share it)."""
    s = Stack(tmp_path_factory.mktemp("compose"), oidc_provider)
    try:
        s.init()
        s.up()
        yield s
    finally:
        s.close(docker_client)


@pytest.fixture
async def hub(stack):
    client = HubClient(stack)
    yield client
    await client.close()


PROBE = "echo GPUHUB:$NVIDIA_VISIBLE_DEVICES:$(id -u):END"
PROBE_RE = re.compile(r"GPUHUB:([^:\s]*):(\d+):END")
