"""GPU kernels in a real hub: a member's server on the CPU profile runs a notebook's kernel on
a GPU, in a container of its own that the hub starts (issue 29).

Real parts: JupyterHub and its proxy, Docker, the reference credits service, the image's
``gpuhub-provisioner`` in the member's server and ``gpuhub-kernel`` in the kernel's
container (built from this tree: GPUHUB_TEST_IMAGE), GPUs from the NVML stand-in (the
kernel's container gets ``NVIDIA_VISIBLE_DEVICES`` from the hook stand-in).  Kernels are
started as JupyterLab starts them: a notebook session through the member's server's REST
API, code through its kernel websocket.  The members' workspaces are host folders owned by
uid 1000, as a member's are.  The "gpu" profile costs 4 credits per hour: 1.00 per
15-minute interval.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import stat
from pathlib import Path

import pytest

from tests.fixtures.hub import eventually, terminal_run
from tests.fixtures.kernels import FACTS, facts_of, run_cell, run_code, spy_command

pytestmark = [pytest.mark.docker, pytest.mark.hub]

GPU_A = "GPU-0c0c0c0c-0000-4000-8000-00000000000a"
GPU_B = "GPU-0c0c0c0c-0000-4000-8000-00000000000b"
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4, "kernels": True},
    {"display_name": "Two GPUs", "slug": "two", "gpus": 2, "kernels": True},
    {
        "display_name": "Course GPU",
        "slug": "course",
        "gpus": 1,
        "kernels": True,
        "allowed_groups": ["ml101"],
    },
]
KERNELS = "/gpuhub/kernels"
SPEC = "gpuhub-gpu"
SPY_RE = re.compile(r"SPY:(\w+):(\d+):(\d+):END")
WHICH_GPU = "import os\nprint('GPU:', os.environ.get('NVIDIA_VISIBLE_DEVICES'))"
KEEPER = "c.Kernels.check_interval = 0.5\n"


def node(*uuids: str, busy: int = 90) -> dict:
    return {
        "devices": [
            {"uuid": u, "name": "Stand-in", "memory_total_mib": 16384, "utilization_gpu": busy}
            for u in uuids
        ]
    }


@pytest.fixture(scope="module")
def kernel_image(docker_client, notebook_image) -> str:
    """The notebook image, with ``gpuhub-kernel`` and the provisioner (built from this tree
    by scripts/build-images.sh); skipped locally, failed in CI, when it is an older one."""
    from tests.fixtures.hub import _need, image_has

    _need(
        image_has(docker_client, notebook_image, "gpuhub-kernel"),
        f"{notebook_image} has no gpuhub-kernel: run scripts/build-images.sh",
    )
    return notebook_image


@pytest.fixture
def workspaces(tmp_path, kernel_image) -> Path:
    root = tmp_path / "homes"
    root.mkdir()
    return root


def hub_env(workspaces: Path, **env) -> dict:
    return {
        "GPUHUB_WORKSPACE": str(workspaces / "{username}"),
        "GPUHUB_WORKSPACE_ROOT": str(workspaces),
        **env,
    }


def home(root: Path, user: str) -> Path:
    """``user``'s workspace, owned by uid 1000 (a member's), with a notebook folder."""
    path = root / user
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 1000, 100)
    path.chmod(0o700)
    return path


def members(prefix: str, *names: str) -> list[str]:
    """Names with no character DockerSpawner escapes in a workspace path ("-")."""
    return [prefix.replace("-", "") + name for name in names]


class Member:
    """A member with her server running: her token, and how JupyterLab reaches it."""

    def __init__(self, hub, name: str, token: str):
        self.hub, self.name, self.token = hub, name, token
        self.headers = {"Authorization": f"token {token}"}
        self.ws_base = hub.url.replace("http://", "ws://", 1) + f"/user/{name}"

    async def server_api(self, method: str, path: str, **kw):
        return await self.hub.client.request(
            method, f"/user/{self.name}/api{path}", headers=self.headers, **kw
        )

    async def open_notebook(self, path: str = "work/train.ipynb", spec: str = SPEC) -> str:
        """Open ``path`` with the kernel ``spec``, as JupyterLab does (a session): the
        Jupyter kernel's id."""
        r = await self.server_api(
            "POST",
            "/sessions",
            json={
                "path": path,
                "type": "notebook",
                "name": os.path.basename(path),
                "kernel": {"name": spec},
            },
        )
        assert r.status_code == 201, r.text
        return r.json()["kernel"]["id"]

    async def run(self, kernel_id: str, code: str, timeout: float = 60) -> str:
        return await run_code(self.ws_base, self.headers, kernel_id, code, timeout)

    async def kernels(self) -> list[dict]:
        r = await self.hub.api("GET", KERNELS, self.token)
        assert r.status_code == 200, r.text
        return r.json()["kernels"]

    async def kernel(self, state: str | None = None, timeout: float = 60) -> dict:
        """Her one kernel that is not ended (or the last one, in ``state``)."""

        async def found():
            mine = await self.kernels()
            live = [k for k in mine if k["state"] != "ended"]
            if state is None:
                return live[0] if len(live) == 1 else None
            there = [k for k in mine if k["state"] == state]
            return there[-1] if there else None

        return await eventually(found, timeout, f"{self.name}'s kernel {state or 'live'}")


async def start_member(hub, name: str, workspaces: Path) -> Member:
    home(workspaces, name)
    member = Member(hub, name, await hub.create_user(name))
    r = await hub.spawn(name, {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name)
    return member


@pytest.fixture
def kernel_hub(gpu_hub, ledger_admin, credits_username, workspaces):
    """A hub factory: ``make(*names, doc=, extra=, paying=, **env)`` starts a hub on the
    NVML stand-in's ``doc`` (default one busy GPU) and, for each short name, a member
    with a running CPU server; those in ``paying`` (default all) get 10 credits.  Returns
    ``(hub, [Member...])``."""

    async def make(*names, doc=None, extra="", paying=None, **env):
        hub = await gpu_hub(
            doc or node(GPU_A), PROFILES, KEEPER + extra, **hub_env(workspaces, **env)
        )
        full = members(credits_username, *names)
        for short, name in zip(names, full, strict=True):
            if paying is None or short in paying:
                await ledger_admin.grant(name, "10.00", key=f"test-grant-{name}")
        return hub, [await start_member(hub, name, workspaces) for name in full]

    return make


async def entries(admin, account) -> list[tuple[str, str, str]]:
    return [
        (t.kind, str(t.amount), t.reason or "") async for t in admin.iter_transactions(account)
    ][::-1]


async def gpus_free(hub) -> int:
    return (await hub.api("GET", "/gpuhub/availability")).json()["free"]


def kernel_containers(hub, client, running: bool = True) -> list[dict]:
    return [
        c
        for c in hub.containers(client)
        if c["Labels"].get("io.gpuhub.kernel") and (c["State"] == "running" or not running)
    ]


def server_container(hub, client, user: str) -> dict:
    return next(
        c
        for c in hub.containers(client)
        if c["Labels"].get("io.gpuhub.user") == user and c["Labels"].get("io.gpuhub.server") == ""
    )


async def settled(admin, account, timeout: float = 30) -> list[tuple[str, str, str]]:
    """The ledger once every debit has its refund."""

    async def done():
        got = await entries(admin, account)
        kinds = [k for k, _, _ in got]
        return (
            got if kinds.count("debit") and kinds.count("debit") == kinds.count("refund") else None
        )

    return await eventually(done, timeout, f"{account}'s kernel settled")


async def test_a_notebook_on_the_cpu_profile_runs_on_a_gpu_kernel_that_hands_its_gpu_on(
    kernel_hub, ledger_admin, workspaces, docker_client
):
    hub, (alice, bob) = await kernel_hub("alice", "bob")
    alice_name, bob_name = alice.name, bob.name

    # her server lists the GPU kernel beside "Python 3", as the hub names it
    r = await alice.server_api("GET", "/kernelspecs")
    specs = r.json()["kernelspecs"]
    assert {"python3", SPEC} <= set(specs) and "gpuhub-course" not in specs, specs
    gpu = specs[SPEC]["spec"]
    assert gpu["display_name"] == "Python 3 (One GPU, 4.00 credits/h)"
    assert gpu["interrupt_mode"] == "message"
    assert gpu["metadata"]["gpuhub"]["free_now"] == 1
    assert gpu["metadata"]["kernel_provisioner"]["provisioner_name"] == "gpuhub-provisioner"

    # a local CPU kernel and a GPU kernel side by side in one server
    local = await alice.open_notebook("work/cpu.ipynb", "python3")
    assert "GPU: void" in await alice.run(local, WHICH_GPU)
    kernel_id = await alice.open_notebook()
    out = await alice.run(
        kernel_id,
        WHICH_GPU + "\nprint('server:', os.environ['JUPYTERHUB_SERVER_NAME'], os.getcwd())",
    )
    assert f"GPU: {GPU_A}" in out, out
    hub_kernel = await alice.kernel("running")
    assert f"server: kernel-{hub_kernel['id']} /home/jovyan/work" in out, out
    assert (hub_kernel["gpus"], hub_kernel["notebook"], hub_kernel["parent"]) == (
        [GPU_A],
        "train.ipynb",
        "",
    )
    assert hub_kernel["server_url"] == f"/user/{alice_name}/kernel-{hub_kernel['id']}/"
    folder = workspaces / alice_name / ".gpuhub" / "kernels" / kernel_id
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == 1000
    assert stat.S_IMODE((folder / "connection.json").stat().st_mode) == 0o600

    # the board lists it apart from servers and jobs; the metrics count it
    cli = (hub.state_dir / "gpuhub-cli-token").read_text().strip()  # `gpuhub gpus`'s
    board = (await hub.api("GET", "/gpuhub/gpus", cli)).json()
    assert [(k["user"], k["profile"], k["notebook"]) for k in board["kernels"]] == [
        (alice_name, "gpu", "train.ipynb")
    ]

    async def counted_running():  # the gauge is set at each pass of the kernels' keeper
        metrics = await hub.client.get(
            "/hub/metrics", headers={"Authorization": f"token {hub.admin_token}"}
        )
        return 'gpuhub_gpu_kernels{state="running"} 1.0' in metrics.text

    await eventually(counted_running, 30, "the metrics counting alice's running GPU kernel")

    # interrupt
    sleeping = asyncio.ensure_future(
        run_cell(alice.ws_base, alice.headers, kernel_id, "import time\ntime.sleep(120)", 60)
    )
    await asyncio.sleep(2)
    r = await alice.server_api("POST", f"/kernels/{kernel_id}/interrupt")
    assert r.status_code == 204, r.text
    _, error = await asyncio.wait_for(sleeping, 30)
    assert error is not None and error["ename"] == "KeyboardInterrupt", error

    # restart: a new kernel process, the same container and GPU
    await alice.run(kernel_id, "x = 42")
    container = kernel_containers(hub, docker_client)[0]["Id"]
    r = await alice.server_api("POST", f"/kernels/{kernel_id}/restart")
    assert r.status_code == 200, r.text
    out = await alice.run(kernel_id, WHICH_GPU + "\nprint('x' in globals())")
    assert f"GPU: {GPU_A}\nFalse" in out, out
    assert [c["Id"] for c in kernel_containers(hub, docker_client)] == [container]
    assert (await alice.kernel("running"))["id"] == hub_kernel["id"]

    # bob's GPU kernel waits in the same line, his notebook's first cell with it
    bobs_kernel = await bob.open_notebook()
    waiting = await bob.kernel("waiting")
    assert waiting["place"]["position"] == 1, waiting
    assert waiting["place"]["message"].startswith("Waiting for a GPU: 1st in line"), waiting
    bobs_cell = asyncio.ensure_future(bob.run(bobs_kernel, WHICH_GPU, timeout=120))

    # alice shuts hers down: the GPU goes back, bob's starts by itself
    r = await alice.server_api("DELETE", f"/sessions/{(await session_of(alice, kernel_id))}")
    assert r.status_code == 204, r.text
    ended = await alice.kernel("ended")
    assert ended["ended"]["reason"] == "shutdown", ended
    assert f"GPU: {GPU_A}" in await asyncio.wait_for(bobs_cell, 150)
    assert (await bob.kernel("running"))["gpus"] == [GPU_A]
    assert "GPU: void" in await alice.run(local, WHICH_GPU)  # her own kernel goes on

    # the ledger: her kernel's debit and refund, named with its notebook
    ledger = await settled(ledger_admin, alice_name)
    assert [k for k, _, _ in ledger] == ["grant", "debit", "refund"], ledger
    assert ledger[1][1] == "1.00" and "GPU kernel" in ledger[1][2], ledger
    assert "train.ipynb" in ledger[1][2] and "GPU kernel" in ledger[2][2], ledger
    r = await bob.server_api("DELETE", f"/kernels/{bobs_kernel}")
    assert r.status_code == 204, r.text
    assert (await bob.kernel("ended"))["ended"]["reason"] == "shutdown"
    await settled(ledger_admin, bob_name)
    assert await eventually(lambda: _free(hub, 1), 30, "the GPU free")
    assert kernel_containers(hub, docker_client) == []


async def _free(hub, count: int) -> bool:
    return await gpus_free(hub) == count


async def session_of(member: Member, kernel_id: str) -> str:
    r = await member.server_api("GET", "/sessions")
    return next(s["id"] for s in r.json() if s["kernel"]["id"] == kernel_id)


async def test_kill_9_of_the_hub_while_kernels_wait_and_run_loses_none_and_pays_once(
    kernel_hub, ledger_admin, workspaces, docker_client
):
    hub, (alice, bob) = await kernel_hub("alice", "bob")
    alice_name, bob_name = alice.name, bob.name
    alices = await alice.open_notebook()
    assert f"GPU: {GPU_A}" in await alice.run(alices, WHICH_GPU)
    bobs = await bob.open_notebook()
    assert (await bob.kernel("waiting"))["place"]["position"] == 1

    hub.kill()  # SIGKILL: no clean-up at all
    await hub.start()
    # alice's kernel runs on, re-adopted with its GPU; bob's still waits, in his place
    assert f"GPU: {GPU_A}" in await alice.run(alices, WHICH_GPU + "\nx = 1")
    running = await alice.kernel("running")
    assert running["gpus"] == [GPU_A]
    assert (await bob.kernel("waiting"))["place"]["position"] == 1
    assert await gpus_free(hub) == 0
    assert len(kernel_containers(hub, docker_client)) == 1  # never a GPU on two

    bobs_cell = asyncio.ensure_future(bob.run(bobs, WHICH_GPU, timeout=150))
    r = await alice.server_api("DELETE", f"/kernels/{alices}")
    assert r.status_code == 204, r.text
    assert f"GPU: {GPU_A}" in await asyncio.wait_for(bobs_cell, 180)
    assert (await bob.kernel("running"))["gpus"] == [GPU_A]  # the line's start, followed
    assert (await alice.kernel("ended"))["ended"]["reason"] == "shutdown"
    ledger = await settled(ledger_admin, alice_name)
    assert [k for k, _, _ in ledger] == ["grant", "debit", "refund"], ledger  # paid once

    # the hub down again, and bob's server killed meanwhile: the restarted hub finds the
    # kernel's parent gone and ends it
    hub.kill()
    docker_client.kill(server_container(hub, docker_client, bob_name)["Id"])
    await hub.start()
    ended = await bob.kernel("ended", timeout=90)
    assert ended["ended"]["reason"] == "parent_gone", ended
    ledger = await settled(ledger_admin, bob_name)
    assert [k for k, _, _ in ledger] == ["grant", "debit", "refund"], ledger
    assert await eventually(lambda: _free(hub, 1), 30, "the GPU free")
    assert kernel_containers(hub, docker_client) == []


async def test_a_kernel_goes_with_its_container_or_its_server_and_is_settled_once(
    kernel_hub, ledger_admin, workspaces, docker_client
):
    hub, (alice, bob) = await kernel_hub("alice", "bob")
    alice_name, bob_name = alice.name, bob.name

    # the kernel's container dies: her server learns why, and starts no second one
    alices = await alice.open_notebook()
    assert f"GPU: {GPU_A}" in await alice.run(alices, WHICH_GPU)
    docker_client.kill(kernel_containers(hub, docker_client)[0]["Id"])
    ended = await alice.kernel("ended", timeout=60)
    assert ended["ended"]["reason"] == "died", ended
    assert "killed (SIGKILL, exit code 137)" in ended["ended"]["message"], ended

    async def gone_from_her_server():
        r = await alice.server_api("GET", "/kernels")
        return all(k["id"] != alices for k in r.json())

    await eventually(gone_from_her_server, 60, "the dead kernel out of her server")
    await asyncio.sleep(4)  # a restarter's attempt would have come by now
    assert len(await alice.kernels()) == 1 and kernel_containers(hub, docker_client) == []
    ledger = await settled(ledger_admin, alice_name)
    assert [k for k, _, _ in ledger] == ["grant", "debit", "refund"], ledger

    # bob's server is killed under his running kernel: the kernel goes, the GPU returns
    bobs = await bob.open_notebook()
    assert f"GPU: {GPU_A}" in await bob.run(bobs, WHICH_GPU)
    docker_client.kill(server_container(hub, docker_client, bob_name)["Id"])
    ended = await bob.kernel("ended", timeout=60)
    assert ended["ended"]["reason"] == "parent_gone", ended
    ledger = await settled(ledger_admin, bob_name)
    assert [k for k, _, _ in ledger] == ["grant", "debit", "refund"], ledger
    assert await eventually(lambda: _free(hub, 1), 30, "the GPU free")
    assert kernel_containers(hub, docker_client) == []


def server_token(hub, client, user: str) -> str:
    env = client.inspect_container(server_container(hub, client, user)["Id"])["Config"]["Env"]
    return next(e.split("=", 1)[1] for e in env if e.startswith("JUPYTERHUB_API_TOKEN="))


async def test_hostile_kernel_requests_are_refused_and_nothing_starts_or_is_charged(
    kernel_hub, ledger_admin, credits_username, workspaces, docker_client
):
    hub, (alice, carol) = await kernel_hub(  # carol: no credits
        "alice",
        "carol",
        doc=node(GPU_A, GPU_B),
        paying=("alice",),
        GPUHUB_MAX_GPUS_PER_USER="1",
        GPUHUB_KERNELS_PER_USER="1",
        GPUHUB_NAMED_SERVER_LIMIT="5",
    )
    alice_name, carol_name = alice.name, carol.name
    (bob_name,) = members(credits_username, "bob")
    bob_token = await hub.create_user(bob_name)
    token = server_token(hub, docker_client, alice_name)  # what her provisioner holds
    for who, folders in (
        (alice_name, (("ok", 0o700), ("open", 0o755))),
        (carol_name, (("ok", 0o700),)),
    ):
        kernels_dir = workspaces / who / ".gpuhub" / "kernels"
        for name, mode in folders:
            (kernels_dir / name).mkdir(parents=True, exist_ok=True)
            os.chown(kernels_dir / name, 1000, 100)
            (kernels_dir / name).chmod(mode)
        os.chown(kernels_dir, 1000, 100)
    os.symlink(workspaces, workspaces / alice_name / ".gpuhub" / "kernels" / "link")
    before = await entries(ledger_admin, alice_name)
    good = {
        "profile": "gpu",
        "notebook": "t.ipynb",
        "cwd": "",
        "connection_dir": ".gpuhub/kernels/ok",
    }

    async def create(who=token, **changes):
        return await hub.api("POST", KERNELS, who, json={**good, **changes})

    cases = [
        ({"profile": "gpu-x"}, 404, "No such GPU kernel"),
        ({"profile": "cpu"}, 404, "offers no GPU kernels"),
        ({"profile": "course"}, 403, "not open to you"),
        ({"profile": "two"}, 409, "each member may hold 1"),  # more GPUs than allowed
        ({"gpus": 4}, 400, "Unexpected field"),
        ({"user": bob_name}, 403, "not this request's"),  # a forged request for bob
        ({"parent": "dev"}, 403, "not this request's"),
        ({"connection_dir": "../bob/.gpuhub/kernels/x"}, 400, "connection_dir"),
        ({"connection_dir": ".gpuhub/kernels/none"}, 400, "make it first"),
        ({"connection_dir": ".gpuhub/kernels/open"}, 403, "yours alone"),
        ({"connection_dir": ".gpuhub/kernels/link"}, 403, "link"),
        ({"cwd": {"a": {"b": {}}}}, 400, "must be a string"),
    ]
    for changes, status, words in cases:
        r = await create(**changes)
        assert (r.status_code, words in r.json()["message"]) == (status, True), (changes, r.text)
    r = await hub.api("POST", KERNELS, token, content=b"[" * 5000 + b"]" * 5000)
    assert r.status_code in (400, 413) and r.json()["message"], r.text
    r = await hub.api("POST", KERNELS, token, content=b"[" * 3000)
    assert r.status_code == 400 and "not JSON" in r.json()["message"], r.text
    r = await hub.api("POST", KERNELS, token, content=b" " * (64 * 1024))
    assert r.status_code == 413, r.text
    # the same 402 sentence as a server of that profile
    r = await hub.api("POST", KERNELS, server_token(hub, docker_client, carol_name), json=good)
    server = await hub.spawn(carol_name, {"profile": "gpu"}, server="gpu")
    assert (r.status_code, server.status_code) == (402, 402), (r.text, server.text)
    assert r.json()["message"] == server.json()["message"]
    assert carol  # her CPU server runs on
    # bob, who has no server running, starts nothing for it
    r = await hub.api("POST", KERNELS, bob_token, json=good)
    assert r.status_code == 409 and "not running" in r.json()["message"], r.text
    # a token without the scope
    r = await hub.api(
        "POST", f"/users/{alice_name}/tokens", json={"scopes": ["read:users:name!user"]}
    )
    r = await hub.api("GET", KERNELS, r.json()["token"])
    assert r.status_code == 403
    # forged kernel servers, through JupyterHub's own API
    forged = [
        (f"/users/{alice_name}/servers/mine", {"profile": "gpu", "kernel": {"id": "x"}}),
        (f"/users/{alice_name}/servers/kernel-0123456789ab", {"profile": "gpu"}),
        (
            f"/users/{alice_name}/servers/kernel-0123456789ab",
            {"profile": "gpu", "kernel": {"id": "0123456789ab", "connection_dir": "x"}},
        ),
    ]
    for path, options in forged:
        r = await hub.api("POST", path, alice.token, json=options)
        assert r.status_code == 403, (path, r.text)
    # nothing started, nothing charged, no kernel
    assert kernel_containers(hub, docker_client, running=False) == []
    assert await entries(ledger_admin, alice_name) == before
    assert await alice.kernels() == []

    # one kernel of hers is allowed (GPUHUB_KERNELS_PER_USER=1); another member's is not
    # hers to see or stop
    r = await create()
    assert r.status_code == 201, r.text
    mine = r.json()
    r = await create(connection_dir=".gpuhub/kernels/ok")
    assert r.status_code == 409 and "each member may have 1" in r.json()["message"], r.text
    for method in ("GET", "DELETE"):
        r = await hub.api(method, f"{KERNELS}/{mine['id']}", bob_token)
        assert r.status_code == 404, r.text
    assert (await hub.api("GET", KERNELS, bob_token)).json()["kernels"] == []
    # her own token sees it too, and may shut it down
    r = await hub.api("DELETE", f"{KERNELS}/{mine['id']}", alice.token)
    assert r.status_code == 204
    assert (await alice.kernel("ended"))["ended"]["reason"] == "shutdown"


async def test_another_members_server_cannot_reach_a_gpu_kernels_channels(
    kernel_hub, ledger_admin, workspaces, docker_client
):
    hub, (alice, bob) = await kernel_hub("alice", "bob", paying=("alice",))
    bob_name = bob.name
    kernel_id = await alice.open_notebook()
    facts = facts_of(await alice.run(kernel_id, FACTS))
    info = facts["info"]
    assert info["transport"] == "ipc", info
    assert info["ip"] == f"/home/jovyan/work/.gpuhub/kernels/{kernel_id}/k", info

    marker = "gpuhub" + secrets.token_hex(4)
    loop = (
        f"import time\nfor _ in range(48):\n"
        f"    print({marker!r}, flush=True)\n    time.sleep(0.25)\n"
    )
    alices_run = asyncio.ensure_future(alice.run(kernel_id, loop))
    await asyncio.sleep(0.5)
    # bob's terminal, on the same host, subscribes to her kernel's iopub
    out = await terminal_run(
        hub, bob_name, bob.token, spy_command(info, marker), expect=":END", timeout=60
    )
    reach, got, seen = SPY_RE.findall(out)[-1]
    assert (await alices_run).count(marker) == 48  # her notebook works
    assert (reach, int(got), int(seen)) == ("ENOENT", 0, 0), out
    # nor through the hub, with his server's token
    hub_id = (await alice.kernel("running"))["id"]
    token = server_token(hub, docker_client, bob_name)
    for method in ("GET", "DELETE"):
        r = await hub.api(method, f"{KERNELS}/{hub_id}", token)
        assert r.status_code == 404, r.text
    assert (await alice.kernel("running"))["id"] == hub_id


async def test_an_idle_gpu_kernel_is_shut_down_and_its_server_goes_on(
    kernel_hub, ledger_admin, docker_client
):
    hub, (alice,) = await kernel_hub(
        "alice",
        doc=node(GPU_A, busy=0),
        extra="c.SpawnerCore.environment = {'GPUHUB_KERNEL_ACTIVITY_INTERVAL': '1'}\n",
        GPUHUB_KERNEL_IDLE_TIMEOUT="6",
    )
    alice_name = alice.name
    local = await alice.open_notebook("work/cpu.ipynb", "python3")
    kernel_id = await alice.open_notebook()
    # cells running keep it: 12 s of them, twice the time-out
    for _ in range(6):
        assert f"GPU: {GPU_A}" in await alice.run(
            kernel_id, WHICH_GPU + "\nimport time; time.sleep(1)"
        )
        await asyncio.sleep(1)
    assert (await alice.kernel())["state"] == "running"
    # then idle: shut down, the GPU back, settled; her server and her own kernel go on
    ended = await alice.kernel("ended", timeout=60)
    assert ended["ended"]["reason"] == "idle", ended
    assert "ran no cell for 6 s" in ended["ended"]["message"]
    await settled(ledger_admin, alice_name)
    assert await eventually(lambda: _free(hub, 1), 30, "the GPU free")
    assert await hub.running(alice_name)
    assert "GPU: void" in await alice.run(local, WHICH_GPU)


def kernel_runs(hub) -> dict[str, str | None]:
    """The run records of the GPU kernels' servers: server name -> stop reason."""
    import sqlite3

    with sqlite3.connect(hub.state_dir / "jupyterhub.sqlite") as db:
        rows = db.execute(
            "SELECT server_name, stop_reason FROM gpuhub_server_runs "
            "WHERE server_name LIKE 'kernel-%'"
        ).fetchall()
    return dict(rows)


async def test_an_idle_gpu_kernel_yields_its_gpu_only_while_another_start_waits(
    kernel_hub, ledger_admin, docker_client
):
    contended = 3
    hub, (alice, bob) = await kernel_hub(
        "alice",
        "bob",
        doc=node(GPU_A, busy=0),
        GPUHUB_KERNEL_IDLE_TIMEOUT="600",
        GPUHUB_KERNEL_CONTENDED_IDLE_TIMEOUT=str(contended),
    )
    alice_name = alice.name
    alices = await alice.open_notebook()
    assert f"GPU: {GPU_A}" in await alice.run(alices, WHICH_GPU)
    hub_kernel = (await alice.kernel("running"))["id"]
    # idle past the contended time-out, with nobody waiting: it keeps its GPU
    await asyncio.sleep(4 * contended)
    assert (await alice.kernel())["state"] == "running"
    assert f"GPU: {GPU_A}" in await alice.run(alices, WHICH_GPU)

    # bob's kernel waits for the GPU: hers, idle, yields it to him
    bobs = await bob.open_notebook()
    assert (await bob.kernel("waiting"))["place"]["position"] == 1
    bobs_cell = asyncio.ensure_future(bob.run(bobs, WHICH_GPU, timeout=120))
    ended = await alice.kernel("ended", timeout=60)
    assert ended["id"] == hub_kernel and ended["ended"]["reason"] == "idle_contended", ended
    message = ended["ended"]["message"]
    assert f"ran no cell for {contended} s while 1 member waited for a GPU" in message, message
    assert f"GPU: {GPU_A}" in await asyncio.wait_for(bobs_cell, 150)
    assert (await bob.kernel("running"))["gpus"] == [GPU_A]

    # counted like the other ends: run record, metrics; settled once
    async def recorded():
        return kernel_runs(hub).get(f"kernel-{hub_kernel}") == "idle_contended"

    await eventually(recorded, 30, "alice's kernel's run record")
    metrics = await hub.client.get(
        "/hub/metrics", headers={"Authorization": f"token {hub.admin_token}"}
    )
    assert 'gpuhub_gpu_kernels_ended_total{reason="idle_contended"} 1.0' in metrics.text
    ledger = await settled(ledger_admin, alice_name)
    assert [k for k, _, _ in ledger] == ["grant", "debit", "refund"], ledger

    # bob's kernel, as idle now, keeps the GPU while nobody waits
    await asyncio.sleep(4 * contended)
    assert (await bob.kernel())["state"] == "running"
    assert f"GPU: {GPU_A}" in await bob.run(bobs, WHICH_GPU)
