"""A member's server is reached by the hub and the proxy only, never by another member's
(issue 28, section 1): each server has a network namespace of its own, whose only way in is
its authenticated HTTP port.  Docker here; a Slurm node's jobs in
``tests/test_slurm_network_hub.py``.

bob runs a kernel, keeps a variable in it and serves two HTTP services of his own (one on
his loopback, one on every address).  alice, from her own server's terminal, lists what her
namespace shows her, then connects to every socket bob's namespace listens on, at his
address and on loopback, and sends to each a ZeroMQ greeting, a marker and megabytes
(``tests/fixtures/probes.py``).  Nothing may connect, bob's log must not hold the marker,
his kernel keeps its memory and his variable, and his services still answer him.
"""

from __future__ import annotations

import json
import secrets

import pytest

from tests.fixtures.hub import started_servers, terminal_run
from tests.fixtures.kernels import run_code, start_kernel
from tests.fixtures.probes import (
    VICTIM,
    VICTIM_AFTER,
    assert_unreached,
    attack_command,
    printed,
    upload_attack,
)

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CPU_ONLY = [{"display_name": "CPU only", "slug": "cpu", "default": True}]


async def members_with_servers(hub_factory, tmp_path, names=("alice", "bob"), **env):
    """A hub on the members' network (tests/fixtures/network.py) with a CPU server for each
    of ``names``; the hub and their API tokens."""
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(CPU_ONLY))
    hub = await hub_factory(GPUHUB_CREDITS="off", GPUHUB_PROFILES=str(profiles), **env)
    return hub, await started_servers(hub, names)


async def test_another_members_server_reaches_none_of_a_servers_sockets(
    hub_factory, docker_client, tmp_path
):
    hub, tokens = await members_with_servers(hub_factory, tmp_path)
    headers = {"Authorization": f"token {tokens['bob']}"}
    kernel = await start_kernel(hub.client, "/user/bob", headers)
    ws_base = hub.url.replace("http://", "ws://", 1) + "/user/bob"
    victim = printed(await run_code(ws_base, headers, kernel, VICTIM), "VICTIM")
    assert victim["address"] != "127.0.0.1", victim  # on the bridge, an address of his own
    assert set(victim["services"].values()) <= set(victim["sockets"]["tcp"]), victim

    marker = "alice" + secrets.token_hex(4)
    await upload_attack(hub, "alice", tokens["alice"])
    out = await terminal_run(
        hub, "alice", tokens["alice"], attack_command(victim, marker), ":END", timeout=120
    )
    attack = printed(out, "ATTACK")
    after = printed(await run_code(ws_base, headers, kernel, VICTIM_AFTER), "AFTER")
    [bobs] = [c for c in hub.containers(docker_client) if c["Labels"]["io.gpuhub.user"] == "bob"]
    log = docker_client.logs(bobs["Id"]).decode(errors="replace")
    assert_unreached(victim, attack, after, log, marker)
    # alice's attempts were refused at once (the network's rules), not left to time out
    assert set(attack["results"].values()) <= {"ECONNREFUSED", "ENOENT"}, attack
    # the hub and the proxy still reach bob's server: his own requests above went through them
    assert await hub.running("bob")
