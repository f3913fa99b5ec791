"""Fixtures for the image tests: the real Docker engine, the built images, a stand-in hub API.

Every container runs with host networking (see shared/MACHINE.md): servers listen on
127.0.0.1 and reach the stand-in hub there.
"""

import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import docker
import docker.errors
import httpx
import jupyterhub
import pytest

from tests.fixtures.hub import _need

#: The images under test; GPUHUB_IMAGE_NAMESPACE (as for scripts/build-images.sh, default
#: gpuhub) tests a build made under another name before it replaces the shared tags.
_NAMESPACE = os.environ.get("GPUHUB_IMAGE_NAMESPACE", "gpuhub")
IMAGES = {
    "base": f"{_NAMESPACE}/base:latest",
    "pytorch": f"{_NAMESPACE}/pytorch:latest",
    "tensorflow": f"{_NAMESPACE}/tensorflow:latest",
}


#: Images CI builds (scripts/setup.sh); the others are tested where someone built them.
REQUIRED = {"base", "pytorch"}


@pytest.fixture(scope="session")
def engine(docker_client):
    """docker-py's high-level client of the engine ``docker_client`` reached (a missing
    engine is skipped locally and fails in CI, as everywhere)."""
    client = docker.from_env()
    yield client
    client.close()


@dataclass
class BuiltImage:
    """A built gpuhub image and one long-running container of it for quick `exec` checks."""

    short: str
    name: str
    labels: dict
    container: object = field(repr=False)

    def exec(self, *cmd, env=None, user=""):
        """Run `cmd` in the container as `user` ("uid:gid"; default: the image's user);
        return stdout, fail on non-zero exit."""
        code, (out, err) = self.container.exec_run(
            list(cmd), environment=env, user=user, demux=True
        )
        out = (out or b"").decode()
        err = (err or b"").decode()
        assert code == 0, f"{' '.join(cmd)} exited {code} in {self.name}:\n{out}{err}"
        return out.strip()

    def python(self, code):
        """Run Python source with the image's own interpreter (the one on its PATH)."""
        return self.exec("python", "-c", code)


def _image(engine, short):
    name = IMAGES[short]
    try:
        image = engine.images.get(name)
    except docker.errors.ImageNotFound:
        why = f"{name} is not built; run scripts/build-images.sh {short}"
        if short in REQUIRED:
            _need(False, why)  # CI builds it: missing there is a failure, not a skip
        pytest.skip(why)
    # tini (the entrypoint) runs sleep as PID 1's child; the container goes when the tests do.
    container = engine.containers.run(name, ["sleep", "infinity"], detach=True, network_mode="host")
    try:
        yield BuiltImage(short, name, image.labels or {}, container)
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module", params=list(IMAGES))
def image(request, engine):
    """Each built image in turn (a missing one is skipped with the command that builds it)."""
    yield from _image(engine, request.param)


@pytest.fixture(scope="module", params=["pytorch", "tensorflow"])
def framework_image(request, engine):
    """Each image that adds a framework to the base."""
    yield from _image(engine, request.param)


@pytest.fixture(scope="module")
def base_image(engine):
    yield from _image(engine, "base")


@pytest.fixture(scope="module")
def pytorch_image(engine):
    yield from _image(engine, "pytorch")


@pytest.fixture(scope="module")
def tensorflow_image(engine):
    yield from _image(engine, "tensorflow")


@pytest.fixture(scope="session")
def hub_version():
    """The version of JupyterHub this project's hub runs."""
    return jupyterhub.__version__


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alice_route(path: str, auth: str | None, version: str) -> tuple[int, dict]:
    """What :class:`HubThatKnowsOnlyAlice` answers (status, JSON body) for ``path``: the
    version, alice for her token, 404 for the rest."""
    if path.rstrip("/") == "/hub/api":
        return 200, {"version": version}
    if path.startswith("/hub/api/user"):
        if auth == f"token {HubThatKnowsOnlyAlice.ALICE_TOKEN}":
            return 200, HubThatKnowsOnlyAlice.ALICE
        return 403, {"status": 403, "message": "not alice"}
    return 404, {"status": 404, "message": "not in this stand-in"}


class HubThatKnowsOnlyAlice:
    """A stand-in for the hub's REST API, enough for jupyterhub-singleuser to start and to
    authenticate requests: `GET /hub/api/` answers the hub's version (the single-user server
    checks it at start and waits for it), `GET /hub/api/user` answers alice's model for
    `ALICE_TOKEN` and 403 for anything else (fails closed).  A subclass answers more GETs
    by overriding :meth:`route`."""

    ALICE_TOKEN = "alice-api-token"
    ALICE = {
        "kind": "user",
        "name": "alice",
        "admin": False,
        "groups": [],
        "server": "/user/alice/",
        "scopes": ["access:servers!server=alice/"],
    }

    def route(self, path: str, auth: str | None) -> tuple[int, dict]:
        """(status, JSON body) of ``GET path`` with the ``Authorization`` header ``auth``."""
        return alice_route(path, auth, self.version)

    def __init__(self, version):
        hub = self
        self.version = version

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hub.requests.append(self.path)
                self.reply(*hub.route(self.path.split("?")[0], self.headers.get("Authorization")))

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-JupyterHub-Version", version)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.requests = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_url = f"http://127.0.0.1:{self.server.server_address[1]}/hub/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def alice_hub(hub_version):
    hub = HubThatKnowsOnlyAlice(hub_version)
    yield hub
    hub.close()


@dataclass
class SingleUserServer:
    """alice's server: the image's own command (jupyterhub-singleuser) in a container."""

    url: str
    container: object = field(repr=False)

    def logs(self):
        return self.container.logs().decode(errors="replace")[-4000:]


@contextmanager
def singleuser_server(engine, image_name, api_url, **run):
    """Start an image the way DockerSpawner does (its CMD, the hub's environment variables for
    alice, host networking), wait until the server answers, at most 60 s; ``run``: more
    arguments of ``containers.run`` (``environment`` entries are added to the hub's)."""
    port = free_port()
    env = {
        "JUPYTERHUB_API_TOKEN": "server-api-token",
        "JUPYTERHUB_API_URL": api_url,
        "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-alice",
        "JUPYTERHUB_USER": "alice",
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/",
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}/user/alice/",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": "/user/alice/oauth_callback",
        "JUPYTERHUB_OAUTH_SCOPES": json.dumps(["access:servers!server=alice/"]),
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES": json.dumps(
            ["access:servers!server=alice/", "access:servers!user=alice"]
        ),
        **run.pop("environment", {}),
    }
    container = engine.containers.run(
        image_name, detach=True, network_mode="host", environment=env, **run
    )
    server = SingleUserServer(f"http://127.0.0.1:{port}/user/alice", container)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{server.url}/api", timeout=2)
                break
            except httpx.TransportError:
                container.reload()
                if container.status == "exited" or time.monotonic() > deadline:
                    pytest.fail(
                        f"alice's server did not answer ({container.status}):\n{server.logs()}"
                    )
                time.sleep(0.1)
        yield server
    finally:
        container.remove(force=True)


@pytest.fixture
def alice_server(engine, base_image, alice_hub):
    """alice's server in gpuhub/base against ``alice_hub`` (:func:`singleuser_server`)."""
    with singleuser_server(engine, base_image.name, alice_hub.api_url) as server:
        yield server
