"""Stock JupyterHub + DockerSpawner, the reference the spawn benchmark compares our hub with.

JupyterHub's own ``jupyterhub`` command with ``dockerspawner.DockerSpawner``: its own
``start()``, its own readiness wait (JupyterHub's ``Server.wait_up`` back-off), the dummy
authenticator and a service token for the REST API. The one addition is the override
DockerSpawner's documentation prescribes for ``network_mode=host`` (``get_ip_and_port``
returning ``host_ip`` and ``port``, see ``DockerSpawner.get_ip_and_port``): this machine runs
every container on the host network (shared/MACHINE.md), and without it DockerSpawner would
ask the host network for an IP it does not have. Each server listens on one fixed free port,
so spawns must not overlap (the benchmark stops each server before the next).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from jupyterhub.utils import random_port

from tests.fixtures.hub import REPO, Hub

CONFIG = '''
from dockerspawner import DockerSpawner


class HostNetworkDockerSpawner(DockerSpawner):
    """DockerSpawner's documented override for network_mode=host, nothing else."""

    async def get_ip_and_port(self):
        return self.host_ip, self.port


c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{tmp}/stock-jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/stock-cookie-secret"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.services = [{{"name": "bench", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": ["bench"]}}]
c.JupyterHub.spawner_class = HostNetworkDockerSpawner
c.DockerSpawner.allowed_images = {images!r}
c.DockerSpawner.network_name = "host"
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.host_ip = "127.0.0.1"
c.DockerSpawner.port = {server_port}
c.DockerSpawner.prefix = "{prefix}"
c.DockerSpawner.remove = True
'''


class StockHub(Hub):
    """A running stock JupyterHub 6 + DockerSpawner 14 with the test Hub's REST helpers.

    ``images``: {choice: image}, picked per spawn with ``user_options={"image": choice}``
    (DockerSpawner's ``allowed_images``)."""

    def __init__(self, tmp: Path, images: dict[str, str]):
        tmp.mkdir(parents=True, exist_ok=True)
        super().__init__(tmp, {})
        self.config_path = tmp / "stock_jupyterhub_config.py"
        self.config_path.write_text(
            CONFIG.format(
                port=self.port,
                hub_port=self.hub_port,
                proxy_api_port=self.proxy_api_port,
                proxy=str(REPO / "node_modules" / ".bin" / "configurable-http-proxy"),
                tmp=tmp,
                token=self.admin_token,
                images=images,
                server_port=random_port(),
                prefix=f"{self.id}-stock",
            )
        )
        self.state_dir = tmp / f"stock-{secrets.token_hex(4)}"  # nothing of ours runs there

    def containers(self, client) -> list[dict]:
        return client.containers(all=True, filters={"name": f"{self.id}-stock"})
