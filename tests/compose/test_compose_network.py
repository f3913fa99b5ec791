"""The production stack on its production network (issue 28): `pod` on the bridge network
`gpuhub`, made and firewalled by ``deploy/network/gpuhub-network.sh`` as the tutorial says.
Only the hub and the proxy reach a member's server; a server reaches the hub API and the
proxy, and neither another member's server (on any port) nor a service of the host (an
identity provider on the gateway's address, a service on every address).

The network is the test's own: its name and /24 come from ``GPUHUB_TEST_SUBNET`` (64 above
the hub tests', tests/fixtures/network.py), removed with its rules at the end.  The identity
provider runs on the host at the bridge's gateway, where the hub (in `pod`) reaches it and
the members' servers must not.
"""

from __future__ import annotations

import os
import socket

import pytest
from jupyterhub.utils import random_port

from tests.compose.conftest import HubClient, Stack
from tests.fixtures.hub import terminal_run
from tests.fixtures.network import MemberNetwork
from tests.fixtures.oidc import running_provider
from tests.fixtures.probes import CONNECT
from tests.test_container import exec_in

pytestmark = [pytest.mark.docker, pytest.mark.compose]

BRIDGE_OVERRIDE = "docker-compose.bridge.yml"


class ProductionNetwork(MemberNetwork):
    """The production network's settings for the script: the hub at the subnet's .2 (pod),
    its API and proxy ports open to the servers, nothing outside."""

    def __init__(self, prefix: str):
        super().__init__(prefix)
        self.name = "gpuhubt-net-" + prefix.replace(".", "-")
        self.hub_address = f"{prefix}.2"
        self.ports = {8081, 8000}

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "GPUHUB_HUB_ADDRESS": self.hub_address}


class BridgeStack(Stack):
    """A :class:`Stack` on ``network``, the proxy published on a free loopback port."""

    def __init__(self, root, oidc, network: ProductionNetwork):
        super().__init__(root, oidc)
        self.network = network
        self.override = self.override.with_name(BRIDGE_OVERRIDE)
        self.override_env["GPUHUB_TEST_NETWORK"] = network.name
        self.credits_url = None  # on pod's loopback, not this machine's

    def init(self) -> None:
        super().init()
        self.set_env(
            GPUHUB_PUBLISH=f"127.0.0.1:{self.ports['GPUHUB_TEST_PORT']}",
            GPUHUB_HUB_ADDRESS=self.network.hub_address,
        )


@pytest.fixture(scope="module")
def network(docker_client):
    a, b, c = os.environ.get("GPUHUB_TEST_SUBNET", "10.216.0").split(".")
    made = ProductionNetwork(f"{a}.{b}.{(int(c) + 64) % 256}")
    made.script("create")
    made.script("rules")
    try:
        yield made
    finally:
        made.script("remove")


@pytest.fixture(scope="module")
def bridge_stack(compose_images, docker_client, network, tmp_path_factory):
    root = tmp_path_factory.mktemp("compose-network")
    # the site's identity provider, on the host's address on the bridge (the issue's :9400)
    with running_provider(root / "oidc.log", host=network.gateway) as provider:
        stack = BridgeStack(root, provider, network)
        try:
            stack.init()
            stack.up()
            yield stack
        finally:
            stack.close(docker_client)


async def test_only_the_hub_reaches_a_server_and_a_server_only_the_hub(
    bridge_stack, docker_client, network
):
    hub = HubClient(bridge_stack)
    try:
        tokens = {name: await hub.login(name) for name in ("alice", "bob")}
        for name, token in tokens.items():
            r = await hub.spawn(name, token, "cpu")
            assert r.status_code in (201, 202), r.text
            await hub.wait_ready(name, token)
        # the hub and the proxy reach bob's server: his terminal, through the proxy
        await terminal_run(hub, "bob", tokens["bob"], "echo GPUHUB:$((6*7)):END", ":END")
    finally:
        await hub.close()
    servers = {c["Labels"]["io.gpuhub.user"]: c for c in bridge_stack.members(docker_client)}
    bobs = servers["bob"]["NetworkSettings"]["Networks"][network.name]["IPAddress"]
    # a service of bob's on every address of his container, and one of the host's
    code, out = exec_in(
        docker_client,
        servers["bob"]["Id"],
        "sh",
        "-c",
        "python3 -m http.server 8765 >/dev/null 2>&1 & sleep 1; echo started",
    )
    assert code == 0 and "started" in out, out
    service = socket.create_server(("0.0.0.0", random_port()))
    provider = bridge_stack.oidc.url.rsplit(":", 1)[1]
    try:
        hub_api = f"{network.hub_address}:8081"
        proxy = f"{network.hub_address}:8000"
        elsewhere = [
            f"{bobs}:8888",  # bob's server itself
            f"{bobs}:8765",  # his own service
            f"{network.gateway}:{provider}",  # the identity provider on the gateway
            f"{network.gateway}:{service.getsockname()[1]}",
            f"{network.hub_address}:8123",  # the credits service, on pod's loopback
            f"{network.hub_address}:5432",  # PostgreSQL, likewise
        ]
        code, out = exec_in(
            docker_client,
            servers["alice"]["Id"],
            "python3",
            "-c",
            CONNECT,
            hub_api,
            proxy,
            *elsewhere,
        )
    finally:
        service.close()
    assert code == 0, out
    reached = dict(line.split() for line in out.splitlines())
    assert (reached.pop(hub_api), reached.pop(proxy)) == ("open", "open"), out
    assert set(reached.values()) == {"ECONNREFUSED"}, out
