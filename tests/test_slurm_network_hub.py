"""Two members' jobs on one Slurm node: neither reaches the other's sockets (issue 28,
section 1).  Each job's sandbox has a network namespace of its own; the hub and the proxy
reach the server through the node's forwarder (hub_ext/slurm/sandbox_net.py).

bob runs a kernel, keeps a variable and serves two HTTP services of his own
(``tests/fixtures/probes.py``).  alice attacks every socket his sandbox listens on twice:
from her own server's terminal, in her sandbox, and as her own uid on the node outside any
sandbox (a plain Slurm job of hers, or a login on the node), where she also sees the node's
listening ports and tries every one of bob's.  Her only success is his server's port as the
hub reaches it, which answers her HTTP request with an error; nothing else connects, his log
holds nothing of hers, his kernel keeps its memory and variable.  Outbound traffic, where a
site allows it (slirp4netns), reaches the outside world but not the node's loopback.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.hub import started_servers, terminal_run
from tests.fixtures.kernels import run_code, start_kernel
from tests.fixtures.probes import (
    ATTACK,
    VICTIM,
    VICTIM_AFTER,
    assert_unreached,
    attack_command,
    attack_spec,
    printed,
    upload_attack,
)

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

CPU_ONLY = [{"display_name": "CPU only", "slug": "cpu", "default": True}]
ON_NODE1 = 'c.GPUSlurmSpawner.req_options = "--nodelist=node1"\n'


def node_run(cluster, node: str, user: str, *argv: str) -> subprocess.CompletedProcess:
    """``argv`` as ``user`` in ``node``'s network namespace, outside any sandbox."""
    netns = f"/run/netns/{os.environ.get('GPUHUB_SLURM_NS_PREFIX', 'ghslurm-')}{node}"
    return subprocess.run(
        ["nsenter", f"--net={netns}", "runuser", "-u", user, "--", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def forwarder(member: str) -> tuple[int, list[str]]:
    """The node's side of ``member``'s sandbox network: its port and its Unix sockets."""
    uid = pwd.getpwnam(member).pw_uid
    [folder] = [d for d in glob.glob("/tmp/gpuhub-net.*") if os.stat(d).st_uid == uid]
    return int(Path(folder, "port").read_text()), sorted(glob.glob(f"{folder}/*.sock"))


def job_log(cluster, member: str) -> str:
    logs = sorted(
        (cluster.shared / "home" / member / ".gpuhub").glob("slurm-*.log*"),
        key=lambda p: p.stat().st_mtime,
    )
    return "".join(p.read_text(errors="replace") for p in logs)


async def test_members_on_one_node_reach_none_of_each_others_sockets(slurm_hub, slurm_cluster):
    alice, bob = slurm_cluster.fresh_member("ghs-na"), slurm_cluster.fresh_member("ghs-nb")
    hub = await slurm_hub(CPU_ONLY, extra_config=ON_NODE1, GPUHUB_CREDITS="off")
    tokens = await started_servers(hub, (alice, bob), timeout=180)
    headers = {"Authorization": f"token {tokens[bob]}"}
    kernel = await start_kernel(hub.client, f"/user/{bob}", headers)
    ws_base = hub.url.replace("http://", "ws://", 1) + f"/user/{bob}"
    victim = printed(await run_code(ws_base, headers, kernel, VICTIM), "VICTIM")
    # his sandbox: its own loopback only (no route out), his services on it
    assert victim["address"] == "127.0.0.1", victim
    assert set(victim["services"].values()) <= set(victim["sockets"]["tcp"]), victim
    port, sockets = forwarder(bob)
    node1 = node_address(slurm_cluster, "node1")

    # from her own server, in her sandbox
    marker = "alice" + secrets.token_hex(4)
    await upload_attack(hub, alice, tokens[alice])
    out = await terminal_run(
        hub,
        alice,
        tokens[alice],
        attack_command(victim, marker, hosts=(node1,), unix=tuple(sockets)),
        ":END",
        timeout=120,
    )
    from_sandbox = printed(out, "ATTACK")
    # her sandbox shows her nothing of the node's or bob's, and reaches nothing off it
    assert port not in from_sandbox["seen"]["tcp"], from_sandbox
    assert from_sandbox["results"][f"{node1}:{port}"] == "ENETUNREACH", from_sandbox

    # as her own uid on the node, outside any sandbox
    script = Path(slurm_cluster.shared / f"attack-{secrets.token_hex(4)}.py")
    script.write_text(ATTACK)
    script.chmod(0o644)
    try:
        done = node_run(
            slurm_cluster,
            "node1",
            alice,
            "python3",
            str(script),
            attack_spec(
                victim,
                marker,
                hosts=(node1,),
                uids=(pwd.getpwnam(bob).pw_uid,),
                unix=tuple(sockets),
            ),
        )
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr
    on_node = printed(done.stdout, "ATTACK")
    assert port in on_node["seen"]["tcp"], on_node  # the node's forwarder: hers to find
    assert {on_node["results"][s] for s in sockets} == {"EACCES"}, on_node  # his folder

    time.sleep(1)  # what reached his server, if anything, is in his log
    after = printed(await run_code(ws_base, headers, kernel, VICTIM_AFTER), "AFTER")
    log = job_log(slurm_cluster, bob)
    assert_unreached(victim, from_sandbox, after, log, marker)
    assert_unreached(victim, on_node, after, log, marker, way_in=port)
    assert await hub.running(bob)


def node_address(cluster, node: str) -> str:
    """``node``'s NodeAddr in the cluster's slurm.conf."""
    for line in (cluster.dir / "slurm.conf").read_text().splitlines():
        if line.startswith(f"NodeName={node} "):
            return line.split("NodeAddr=", 1)[1].split()[0]
    raise AssertionError(f"no {node} in slurm.conf")


SERVICE = """
import http.server, sys
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"outside says hello")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Answer).serve_forever()
"""

#: fetches each URL, the first again for up to ``patience`` seconds while it fails (a loaded
#: machine: slirp4netns may come up after the kernel asks)
FETCH = """
import sys, time, urllib.request
for n, url in enumerate(urls):
    deadline = time.monotonic() + (patience if n == 0 else 0)
    while True:
        try:
            print(url, urllib.request.urlopen(url, timeout=5).read().decode())
            break
        except Exception as e:
            if time.monotonic() > deadline:
                print(url, type(e).__name__)
                break
            time.sleep(1)
"""


@pytest.mark.parametrize("outbound", ["none", "slirp4netns"])
async def test_outbound_traffic_reaches_outside_but_never_the_nodes_loopback(
    slurm_hub, slurm_cluster, outbound, tmp_path
):
    # GPUHUB_SLURM_OUTBOUND: a service outside the node (on the controller's address) is
    # reached with slirp4netns, nothing without; the node's loopback never
    member = slurm_cluster.fresh_member("ghs-no")
    from jupyterhub.utils import random_port

    port, loop_port = random_port(), random_port()
    controller = slurm_cluster.controller_address
    code = tmp_path / "service.py"
    code.write_text(SERVICE)
    outside = subprocess.Popen(["python3", str(code), controller, str(port)])
    netns = f"/run/netns/{os.environ.get('GPUHUB_SLURM_NS_PREFIX', 'ghslurm-')}node1"
    on_loopback = subprocess.Popen(
        ["nsenter", f"--net={netns}", "python3", str(code), "127.0.0.1", str(loop_port)]
    )
    try:
        hub = await slurm_hub(
            CPU_ONLY, extra_config=ON_NODE1, GPUHUB_CREDITS="off", GPUHUB_SLURM_OUTBOUND=outbound
        )
        token = await hub.create_user(member)
        r = await hub.spawn(member, {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready(member, timeout=180)
        headers = {"Authorization": f"token {token}"}
        kernel = await start_kernel(hub.client, f"/user/{member}", headers)
        ws_base = hub.url.replace("http://", "ws://", 1) + f"/user/{member}"
        urls = [
            f"http://{controller}:{port}/",
            f"http://127.0.0.1:{loop_port}/",
            f"http://10.0.2.2:{loop_port}/",  # slirp4netns's address of the node
        ]
        patience = 60 if outbound != "none" else 0
        fetch = f"urls = {urls!r}\npatience = {patience}\n" + FETCH
        out = await run_code(ws_base, headers, kernel, fetch)
    finally:
        outside.terminate()
        on_loopback.terminate()
    answers = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith("http"))
    reached = answers[urls[0]] == "outside says hello"
    log = job_log(slurm_cluster, member)
    said = [line for line in log.splitlines() if "gpuhub:" in line or outbound in line]
    assert reached == (outbound != "none"), (said, answers, log[-3000:])
    assert "hello" not in answers[urls[1]] + answers[urls[2]], answers
