"""GPU kernels on the Slurm backend (issue 29): a member's server on the CPU profile runs a
notebook's kernel as a batch job on a GPU node of the two-node test cluster, its channels
carried by the relay (images/base/gpuhub_kernels/gpuhub_kernels/relay.py, the hub's end
hub_ext/kernels/relay.py).

Real parts: JupyterHub and its proxy, Slurm (tests/fixtures/slurm.py), the reference credits
service, the image's ``gpuhub-provisioner`` in the member's server and ``gpuhub-kernel`` in
the kernel's job (built from this tree: GPUHUB_TEST_IMAGE).  The "gpu" profile costs 4
credits per hour: 1.00 per 15-minute interval.  One hub for the whole journey (CI time).
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import pwd
import re
from pathlib import Path

import pytest

from tests.fixtures.hub import eventually, started_servers
from tests.test_credits_hub import grant, ledger
from tests.test_gpu_kernels_hub import SPEC, Member
from tests.test_slurm_jobs_hub import admin, jobs_hub  # noqa: F401 - fixtures
from tests.test_slurm_network_hub import node_address, node_run

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4, "kernels": True},
]
WHICH_GPU = (
    "import os\n"
    "print('GPU:', ':'.join(os.environ.get(k, '') for k in "
    "('SLURMD_NODENAME', 'SLURM_JOB_ID', 'SLURM_JOB_GPUS', 'CUDA_VISIBLE_DEVICES')), "
    "os.getuid(), os.environ.get('JUPYTERHUB_SERVER_NAME'), os.getcwd(), ':END')"
)
SEEN = re.compile(r"GPU: (\w+):(\d+):(\d+):(\d+) (\d+) (kernel-\w+) (\S+) :END")

#: a websocket handshake to a kernel's relay, from the standard library (the nodes'
#: Python): prints the status line and whether a ZeroMQ greeting came through
PROBE = r"""
import base64, os, socket, sys
host, port, path, token = sys.argv[1:5]
try:
    s = socket.create_connection((host, int(port)), timeout=10)
except OSError as e:
    print("PROBE refused", e); sys.exit(0)
lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket",
         "Connection: Upgrade", "Sec-WebSocket-Version: 13",
         "Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)).decode()]
if token:
    lines.append(f"Authorization: token {token}")
s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
s.settimeout(5)
data = b""
try:
    while b"\r\n\r\n" not in data:
        more = s.recv(4096)
        if not more:
            break
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    if b" 101 " in head.split(b"\r\n")[0]:
        while len(rest) < 3:
            rest += s.recv(4096)
except OSError:
    head, rest = data, b""
status = head.split(b"\r\n")[0].decode(errors="replace")
# a binary frame (0x82) whose payload opens with ZeroMQ's signature (0xff ... 0x7f)
greeting = len(rest) > 2 and rest[0] == 0x82 and rest[2] == 0xFF
print("PROBE", status, "GREETING" if greeting else "NOTHING")
"""


def kernel_jobs(cluster, member: str) -> dict[str, tuple[str, str]]:
    """``member``'s running kernel jobs: job id -> (Slurm job name, node)."""
    out = cluster.run("squeue", "-h", "-u", member, "-t", "R", "-o", "%i %j %N").stdout
    return {
        i: (name, node)
        for i, name, node in (line.split() for line in out.splitlines())
        if "-kernel-" in name
    }


def kernel_port(cluster, member: str, node: str, hub_id: str) -> int:
    """The node's port of ``member``'s kernel ``hub_id`` (the forwarder of its sandbox,
    which answers a plain request with the kernel's id)."""
    import urllib.request

    uid = pwd.getpwnam(member).pw_uid
    for folder in glob.glob("/tmp/gpuhub-net.*"):
        try:
            if os.stat(folder).st_uid != uid:
                continue
            port = int(Path(folder, "port").read_text())
            url = f"http://{node_address(cluster, node)}:{port}/"
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - a test host
                if json.load(r).get("kernel") == hub_id:
                    return port
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no forwarder of {member}'s kernel {hub_id} on {node}")


def probe(cluster, node: str, user: str, host: str, port: int, path: str, token: str) -> str:
    done = node_run(cluster, node, user, "python3", "-c", PROBE, host, str(port), path, token)
    line = [w for w in done.stdout.splitlines() if w.startswith("PROBE")]
    assert line, done.stdout + done.stderr
    return line[-1]


async def test_a_notebook_on_a_cpu_server_runs_its_kernel_as_a_slurm_gpu_job_only_she_reaches(
    jobs_hub,  # noqa: F811 - the fixture imported above
    slurm_cluster,
    admin,  # noqa: F811
):
    alice = slurm_cluster.fresh_member("ghs-ka")
    bob = slurm_cluster.fresh_member("ghs-kb")
    hub = await jobs_hub(PROFILES)
    tokens = await started_servers(hub, (alice, bob), timeout=240)
    await grant(admin, alice, "10.00")
    her = Member(hub, alice, tokens[alice])

    # her server lists the GPU kernel; a notebook on it runs on a Slurm GPU of its own job
    r = await her.server_api("GET", "/kernelspecs")
    assert SPEC in r.json()["kernelspecs"], r.text
    kernel_id = await her.open_notebook("train.ipynb")
    out = await her.run(kernel_id, WHICH_GPU, timeout=240)
    seen = SEEN.search(out)
    assert seen, out
    node, job_id, slurm_gpu, cuda, uid, server, cwd = seen.groups()
    running = await her.kernel("running")
    assert server == f"kernel-{running['id']}" and uid == str(pwd.getpwnam(alice).pw_uid), out
    assert cuda == "0" and running["gpus"] == [f"{node}/gpu{slurm_gpu}"], (out, running)
    assert kernel_jobs(slurm_cluster, alice) == {
        job_id: (f"gpuhub-kernel-{alice}-{server}", node)
    }, out
    assert cwd == "/home/jovyan/work", out

    # bob, as his own uid on the kernel's node and on the other node, with no token and
    # with his own: refused, nothing of her channels; her own token from the other node
    # reaches it (the probe works), and through the hub bob's token finds no such kernel
    other = "node1" if node == "node2" else "node2"
    port = kernel_port(slurm_cluster, alice, node, running["id"])
    host = node_address(slurm_cluster, node)
    path = f"/user/{alice}/{server}/relay/2"
    for where in (node, other):
        for token in ("", tokens[bob]):
            got = probe(slurm_cluster, where, bob, host, port, path, token)
            assert "403" in got and "NOTHING" in got, (where, bool(token), got)
    got = probe(slurm_cluster, other, alice, host, port, path, tokens[alice])
    assert " 101 " in got and "GREETING" in got, got
    for token in (tokens[bob], ""):
        r = await hub.client.get(
            f"/hub/api/gpuhub/kernels/{running['id']}/channels/2",
            headers={"Authorization": f"token {token}"} if token else {},
        )
        assert r.status_code in (403, 404), r.text
    r = await hub.client.get(  # hers, not a websocket: refused before the kernel is asked
        f"/hub/api/gpuhub/kernels/{running['id']}/channels/2", headers=her.headers
    )
    assert (r.status_code, r.json()["message"]) == (400, "A GPU kernel's channel is a websocket.")
    # the channels' sockets are in the sandboxes: the node's forwarder folder is hers alone
    uid = pwd.getpwnam(alice).pw_uid
    hers = [d for d in glob.glob("/tmp/gpuhub-net.*") if os.stat(d).st_uid == uid]
    listing = node_run(slurm_cluster, node, bob, "ls", *hers)
    assert hers and "server.sock" not in listing.stdout, listing.stdout + listing.stderr
    assert listing.stderr.count("Permission denied") == len(hers), listing.stderr

    # restart: a new kernel process, the same job and GPU
    await her.run(kernel_id, "x = 42")
    r = await her.server_api("POST", f"/kernels/{kernel_id}/restart", timeout=120)
    assert r.status_code == 200, r.text
    out = await her.run(kernel_id, WHICH_GPU + "\nprint('x' in globals())")
    assert SEEN.search(out).groups()[:4] == (node, job_id, slurm_gpu, cuda), out
    assert out.rstrip().endswith("False"), out
    assert (await her.kernel("running"))["id"] == running["id"]

    # kill -9 of the hub: the kernel's job runs on, her relay connects again through the
    # restarted hub, the same job and GPU answer
    hub.kill()
    await hub.start()
    out = await her.run(kernel_id, WHICH_GPU, timeout=180)
    assert SEEN.search(out).groups()[:4] == (node, job_id, slurm_gpu, cuda), out
    assert (await her.kernel("running"))["id"] == running["id"]

    # shutdown: the job ends, the GPU goes back, the ledger settles once
    r = await her.server_api("DELETE", f"/kernels/{kernel_id}")
    assert r.status_code == 204, r.text
    ended = await her.kernel("ended")
    assert ended["ended"]["reason"] == "shutdown", ended
    await eventually(lambda: _no_kernel_job(slurm_cluster, alice), 60, "her kernel's job gone")
    # her relay may ask for the ended kernel's channels again: gone, in words (not a 500)
    r = await hub.client.get(
        f"/hub/api/gpuhub/kernels/{running['id']}/channels/2",
        headers={**her.headers, "Upgrade": "websocket", "Connection": "Upgrade"},
    )
    assert (r.status_code, r.json()["message"]) == (
        410,
        f"The GPU kernel {running['id']} has ended.",
    ), r.text

    async def settled():
        got = await ledger(admin, alice)
        return got if [k for k, _ in got] == ["grant", "debit", "refund"] else None

    entries = await eventually(settled, 60, "her kernel's debit and refund")
    assert entries[1] == ("debit", "1.00"), entries

    # the kernel's job dies: the kernel ends with the reason in words, settled once
    kernel_id = await her.open_notebook("again.ipynb")
    assert SEEN.search(await her.run(kernel_id, WHICH_GPU, timeout=240))
    second = await her.kernel("running")
    [(job_id, _)] = kernel_jobs(slurm_cluster, alice).items()
    slurm_cluster.run("scancel", job_id)

    async def second_ended():
        return next((k for k in await her.kernels() if k["id"] == second["id"]), {}).get("ended")

    ended = {"ended": await eventually(second_ended, 120, "her second kernel ended")}
    assert ended["ended"]["reason"] == "died", ended
    assert f"Slurm job {job_id}" in ended["ended"]["message"], ended

    async def dead():
        r = await her.server_api("GET", f"/kernels/{kernel_id}")
        return r.status_code == 404 or r.json().get("execution_state") == "dead"

    await eventually(dead, 60, "her server reporting the kernel dead")

    async def settled_twice():
        got = await ledger(admin, alice)
        kinds = [k for k, _ in got]
        return got if kinds.count("debit") == 2 and kinds.count("refund") == 2 else None

    await eventually(settled_twice, 60, "the dead kernel's debit and refund")
    await asyncio.sleep(2)  # nothing more comes: paid once
    assert [k for k, _ in await ledger(admin, alice)].count("refund") == 2


async def _no_kernel_job(cluster, member: str) -> bool:
    return kernel_jobs(cluster, member) == {}
