"""``GET /hub/api/gpuhub/gpus/mine`` on the Slurm backend, asked from inside a member's
server with its own token, as JupyterLab's status bar asks: her job's GPU, named as the
GPU board names it, without figures (the hub does not run on the nodes); another
member's server reads only his (:mod:`hub_ext.ops.my_gpus`,
:meth:`hub_ext.slurm.availability.SlurmAvailability.held_gpus`)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.fixtures.hub import terminal_run
from tests.test_slurm_hub import probe

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
]
#: prints "MINE <the answer's JSON>" for the server's own token
READER = """
import os, urllib.request
req = urllib.request.Request(os.environ["JUPYTERHUB_API_URL"] + "/gpuhub/gpus/mine",
    headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]})
print("MINE", urllib.request.urlopen(req, timeout=20).read().decode())
"""


async def read_mine(hub, slurm_cluster, name: str, token: str) -> list[dict]:
    path = slurm_cluster.shared / "home" / name / "mine.py"
    path.write_text(READER)
    shutil.chown(path, name, name)
    out = await terminal_run(hub, name, token, "python3 work/mine.py", expect="MINE {")
    return json.loads(re.findall(r"MINE (\{.*\})", out)[-1])["gpus"]


async def test_a_slurm_server_reads_its_jobs_gpu_and_not_another_members(slurm_hub, slurm_cluster):
    alice, bob = (slurm_cluster.fresh_member(p) for p in ("ghs-mine", "ghs-his"))
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    tokens = {name: await hub.create_user(name) for name in (alice, bob)}
    for name in (alice, bob):
        r = await hub.spawn(name, {"profile": "gpu"})
        assert r.status_code in (201, 202), r.text
    for name in (alice, bob):
        await hub.wait_ready(name, timeout=180)

    for name in (alice, bob):
        where = await probe(hub, name, tokens[name])
        gpu = f"{where['node']}/gpu{where['gpu']}"
        assert await read_mine(hub, slurm_cluster, name, tokens[name]) == [
            {
                "uuid": gpu,
                "name": f"{where['node']} GPU {where['gpu']}",
                "held_by": "",
                "utilization_pct": None,
                "memory_used_mib": None,
                "memory_total_mib": None,
                "simulated": False,
            }
        ]
