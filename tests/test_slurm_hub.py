"""The Slurm backend end to end: a real hub and proxy, batchspawner's SlurmSpawner (ours on
top), a real two-node Slurm cluster (tests/fixtures/slurm.py), the notebook image in the
nodes' container runtime, members' jobs under their own uids."""

from __future__ import annotations

import asyncio
import copy
import json
import pwd
import re

import pytest

from hub_ext.config import DEFAULT_PROFILES
from hub_ext.spawn.profiles import kernels_allowed
from tests.fixtures.hub import terminal_run

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
]

PROBE = (
    "echo GPUHUB:$SLURMD_NODENAME:$SLURM_JOB_GPUS:$CUDA_VISIBLE_DEVICES:$(id -u):"
    "$(ls /dev | grep nvidia | tr '\\n' ,):$(touch work/probe && stat -c %u work/probe):END"
)
PROBE_RE = re.compile(r"GPUHUB:(\w+):(\d+):(\d*):(\d+):([\w,]*):(\d+):END")


async def probe(hub, user, token) -> dict:
    out = await terminal_run(hub, user, token, PROBE, expect=":END", timeout=60)
    node, gpu, cuda, uid, devices, owner = PROBE_RE.findall(out)[-1]
    return {
        "node": node,
        "gpu": gpu,
        "cuda": cuda,
        "uid": int(uid),
        "devices": devices.rstrip(","),
        "owner": int(owner),
    }


async def events_until(hub, name: str, text: str, timeout: float = 120) -> list[str]:
    """The spawn's progress messages (JupyterHub's event stream) up to one containing
    ``text``."""
    seen = []
    headers = {"Authorization": f"token {hub.admin_token}"}

    async def read():
        async with hub.client.stream(
            "GET", f"/hub/api/users/{name}/server/progress", headers=headers, timeout=timeout
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    message = json.loads(line[5:]).get("message", "")
                    seen.append(message)
                    if text in message:
                        return seen
        raise AssertionError(f"no {text!r} in the progress events: {seen}")

    return await asyncio.wait_for(read(), timeout)


@pytest.fixture
def members(slurm_cluster):
    names = [f"ghs-h{i}" for i in range(1, 6)]
    for name in names:
        slurm_cluster.member(name)
    return names


async def test_four_members_get_four_gpus_on_both_nodes_and_a_fifth_waits_in_line(
    slurm_hub, slurm_cluster, members
):
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    tokens = {name: await hub.create_user(name) for name in members}
    for name in members[:4]:
        r = await hub.spawn(name, {"profile": "gpu"})
        assert r.status_code in (201, 202), r.text
    for name in members[:4]:
        await hub.wait_ready(name, timeout=180)

    seen = {name: await probe(hub, name, tokens[name]) for name in members[:4]}
    assert {(s["node"], s["gpu"]) for s in seen.values()} == {
        ("node1", "0"),
        ("node1", "1"),
        ("node2", "0"),
        ("node2", "1"),
    }
    for name, s in seen.items():
        uid = pwd.getpwnam(name).pw_uid
        assert (s["uid"], s["owner"]) == (uid, uid)  # their own uid, their own files
        assert s["devices"] == f"nvidia{s['gpu']}"  # only the GPU Slurm gave the job
        assert s["cuda"] == "0"  # the job's one GPU, as CUDA numbers it there

    # every GPU taken: a member who did not ask to wait is refused at once, in the
    # spawn page card's words; one who asks to wait is a place in line
    fifth = members[4]
    r = await hub.spawn(fifth, {"profile": "gpu"})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (
        "No GPU free: all 4 GPUs are in use. You can wait in line "
        "for one, try the CPU profile or come back later."
    )
    r = await hub.spawn(fifth, {"profile": "gpu", "wait": True})
    # 201 too: after a failed start JupyterHub answers for a spawner it replaced
    assert r.status_code in (201, 202), r.text
    sentence = (
        "You are 1st in line for 1 GPU (One GPU). Estimated wait: unknown. "
        "Your place is kept for about 1 h more."
    )
    events = await events_until(hub, fifth, "1st in line")
    assert sentence in events
    r = await hub.api("GET", "/gpuhub/line", token=tokens[fifth])
    assert r.status_code == 200, r.text
    [place] = r.json()["places"]
    assert (place["user"], place["position"], place["sentence"]) == (fifth, 1, sentence)

    await hub.stop_server(members[0], timeout=120)
    await hub.wait_ready(fifth, timeout=180)  # started without asking again
    assert (await probe(hub, fifth, tokens[fifth]))["node"] == seen[members[0]]["node"]


async def test_datasets_are_read_only_and_per_group_on_the_nodes(
    slurm_hub, slurm_cluster, tmp_path
):
    # the same GPUHUB_DATASETS file as on Docker: one dataset for everyone, one for a group
    root = slurm_cluster.shared / "datasets"
    for name in ("mnist", "imagenet"):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "README").write_text(f"{name}\n")
    datasets = tmp_path / "datasets.json"
    datasets.write_text(
        json.dumps(
            {
                "mnist": {"path": str(root / "mnist")},
                "imagenet": {"path": str(root / "imagenet"), "groups": ["vision"]},
            }
        )
    )
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off", GPUHUB_DATASETS=str(datasets))
    bob, vera = "ghs-ds1", "ghs-ds2"
    for name in (bob, vera):
        slurm_cluster.member(name)
    tokens = {name: await hub.create_user(name) for name in (bob, vera)}
    r = await hub.api("POST", "/groups/vision", json={"users": [vera]})
    assert r.status_code == 201, r.text
    for name in (bob, vera):
        r = await hub.spawn(name, {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
    look = (
        "echo DS:$(ls /datasets | tr '\\n' ,):$(cat /datasets/*/README | tr '\\n' ,):"
        "$(touch /datasets/mnist/new 2>&1 | grep -c 'Read-only'):END"
    )
    seen = {}
    for name in (bob, vera):
        await hub.wait_ready(name, timeout=180)
        out = await terminal_run(hub, name, tokens[name], look, expect=":END", timeout=60)
        seen[name] = re.findall(r"DS:(.*?):(.*?):(\d+):END", out)[-1]
    # not his group: not there at all; read-only for everyone
    assert seen[bob] == ("mnist,", "mnist,", "1")
    assert seen[vera] == ("imagenet,mnist,", "imagenet,mnist,", "1")
    assert not (root / "mnist" / "new").exists()


async def test_on_slurm_the_shipped_pytorch_profile_offers_its_gpu_kernel(slurm_hub, slurm_cluster):
    """GPU kernels run on Slurm too (docs: howto/slurm, "GPU kernels"): a Slurm hub on the
    shipped profiles lists the PyTorch one's GPU kernel for JupyterLab's launcher and
    kernel picker, with the GPUs of its Slurm partition (the journey itself:
    tests/test_slurm_kernels_hub.py)."""
    profiles = copy.deepcopy(DEFAULT_PROFILES)
    for profile in profiles:
        profile["spawner_override"].pop("image")  # GPUHUB_IMAGE: the image the nodes run
    hub = await slurm_hub(profiles, GPUHUB_CREDITS="off")
    name = "ghs-kn1"
    slurm_cluster.member(name)
    token = await hub.create_user(name)
    r = await hub.api("GET", "/gpuhub/kernels/specs", token)
    assert r.status_code == 200, r.text
    specs = {s["name"]: s for s in r.json()}
    wanted = {f"gpuhub-{p['slug']}" for p in profiles if kernels_allowed(p)}
    assert set(specs) == wanted == {"gpuhub-pytorch"}, r.text
    assert specs["gpuhub-pytorch"]["gpus"] == 1 and specs["gpuhub-pytorch"]["total"] >= 1, r.text
