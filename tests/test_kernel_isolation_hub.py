"""One member cannot read another's kernels where their servers share a network namespace
(issue 21): Docker with host networking (``GPUHUB_DOCKER_NETWORK=host``) and two jobs on one
Slurm node.  Each server has a namespace of its own by default since issue 28
(``tests/test_member_network_hub.py``); these check the images' own line of defence, for
servers that share one all the same.

bob runs code in his kernel as JupyterLab does, printing a marker; alice, from her own
terminal, subscribes to his kernel's iopub channel with pyzmq, as the attacker did.  The
image's kernels listen on Unix sockets in bob's private runtime folder (images/base
``jupyter_server_config.json``), so there is no TCP port to reach and no socket file alice
can see.
"""

from __future__ import annotations

import asyncio
import json
import pwd
import re
import secrets
import subprocess

import pytest

from tests.fixtures.hub import started_servers, terminal_run
from tests.fixtures.kernels import (
    FACTS,
    facts_of,
    kernel_ports,
    run_code,
    spy_command,
    start_kernel,
)

SPY_RE = re.compile(r"SPY:(\w+):(\d+):(\d+):END")
CPU_ONLY = [{"display_name": "CPU only", "slug": "cpu", "default": True}]
PRINTS = 48  # one every 0.25 s: bob's kernel publishes for 12 s while alice listens for 4


async def alice_spies_on_bob(hub, alice: str, bob: str, tokens: dict) -> dict:
    """bob starts a kernel and prints a marker in it for 12 s; meanwhile alice's terminal
    subscribes to that kernel's iopub.  Returns bob's kernel facts (FACTS), what alice got,
    and how many markers bob saw in his own output."""
    headers = {"Authorization": f"token {tokens[bob]}"}
    kernel = await start_kernel(hub.client, f"/user/{bob}", headers)
    ws_base = hub.url.replace("http://", "ws://", 1) + f"/user/{bob}"
    facts = facts_of(await run_code(ws_base, headers, kernel, FACTS))
    marker = "gpuhub" + secrets.token_hex(4)
    loop = (
        f"import time\nfor _ in range({PRINTS}):\n"
        f"    print({marker!r}, flush=True)\n    time.sleep(0.25)\n"
    )
    bobs_run = asyncio.create_task(run_code(ws_base, headers, kernel, loop))
    await asyncio.sleep(0.5)  # his loop has started printing
    out = await terminal_run(
        hub, alice, tokens[alice], spy_command(facts["info"], marker), expect=":END", timeout=60
    )
    reach, got, seen = SPY_RE.findall(out)[-1]
    bobs_out = await bobs_run
    return {
        "facts": facts,
        "reach": reach,
        "got": int(got),
        "seen": int(seen),
        "bob_saw": bobs_out.count(marker),
        "kernel": kernel,
    }


def assert_private(spied: dict) -> None:
    facts = spied["facts"]
    assert spied["bob_saw"] == PRINTS  # bob's own notebook works
    # alice: not one message, and no socket file of his to connect to
    assert (spied["got"], spied["seen"]) == (0, 0), spied
    assert spied["reach"] in ("ENOENT", "EACCES"), spied
    # his kernel: Unix sockets in his runtime folder, no port in /proc/net/tcp (but
    # ipykernel's fork pipe, which sends nothing: tests/fixtures/kernels.py)
    assert facts["info"]["transport"] == "ipc", facts
    assert facts["info"]["ip"].startswith("/home/jovyan/.local/share/jupyter/runtime/kernel-")
    assert kernel_ports(facts) == [], facts


@pytest.mark.docker
@pytest.mark.hub
async def test_host_network_members_cannot_read_each_others_kernels(hub_factory, tmp_path):
    profiles = tmp_path / "profiles.json"  # no image named: the hub's (the image under test)
    profiles.write_text(json.dumps(CPU_ONLY))
    hub = await hub_factory(
        GPUHUB_CREDITS="off", GPUHUB_PROFILES=str(profiles), GPUHUB_DOCKER_NETWORK="host"
    )
    tokens = await started_servers(hub, ("alice", "bob"))
    assert_private(await alice_spies_on_bob(hub, "alice", "bob", tokens))


@pytest.mark.slurm
@pytest.mark.hub
@pytest.mark.docker
async def test_members_on_one_slurm_node_cannot_read_each_others_kernels(slurm_hub, slurm_cluster):
    alice, bob = "ghs-k1", "ghs-k2"
    for name in (alice, bob):
        slurm_cluster.member(name)
    # both jobs on node1: one network namespace, one loopback
    hub = await slurm_hub(
        CPU_ONLY,
        extra_config='c.GPUSlurmSpawner.req_options = "--nodelist=node1"\n',
        GPUHUB_CREDITS="off",
    )
    tokens = await started_servers(hub, (alice, bob), timeout=180)
    spied = await alice_spies_on_bob(hub, alice, bob, tokens)
    assert_private(spied)

    # nor as alice's uid on the node itself, outside her sandbox: bob's kernel's files
    # through /proc/<pid>/root are refused (another uid's process)
    pids = subprocess.run(
        ["pgrep", "-u", bob, "-f", "ipykernel_launcher"], capture_output=True, text=True
    ).stdout.split()
    assert pids, "bob's kernel is not running on the node"
    runtime = f"/proc/{pids[0]}/root/home/jovyan/.local/share/jupyter/runtime"
    looked = subprocess.run(
        ["runuser", "-u", alice, "--", "ls", runtime], capture_output=True, text=True
    )
    assert looked.returncode != 0 and "Permission denied" in looked.stderr, looked
    assert pwd.getpwnam(alice).pw_uid != pwd.getpwnam(bob).pw_uid
