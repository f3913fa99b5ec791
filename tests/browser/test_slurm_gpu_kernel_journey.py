"""Issue 29's journey on the Slurm backend, in a real browser: the steps of the Docker
journey (tests/browser/test_gpu_kernel_journey.py, :func:`alice_then_bob`), each GPU kernel
a batch job on a GPU node of the two-node test cluster, its channels carried by the relay.

alice's server on the CPU profile is a Slurm job; her notebook's GPU kernel is another, on
the one GPU of the cluster's four that plain jobs of another member leave free
(:func:`tests.test_slurm_faults.hold_every_gpu`), so bob's GPU kernel waits in line until
she shuts hers down.  Her cell prints the GPU as the hub names it (``node2/gpu1``), from
Slurm's variables inside the kernel.  bob shuts his down too, and the ledger shows each
kernel's debit and refund.

Real parts: Chromium (Playwright), the OIDC provider, JupyterHub and its proxy, the
reference credits service, slurmctld and two slurmd nodes (tests/fixtures/slurm.py), the
notebook images unpacked for the nodes (the CPU profile's: ``GPUHUB_TEST_IMAGE``; the
PyTorch profile's: ``GPUHUB_TEST_KERNEL_IMAGE``), the hub's shipped profiles on them.
``GPUHUB_DOCS_SCREENSHOTS=1`` keeps the steps docs/howto/gpu-in-jupyterlab.md shows ("On a
Slurm cluster").
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.browser.test_gpu_kernel_journey import (
    KERNEL_IMAGE,
    Backend,
    alice_then_bob,
    kernels_paid,
    shipped_profiles,
    shut_down_kernel,
)
from tests.browser.test_journey import grant
from tests.fixtures.slurm import SCRIPT
from tests.test_slurm_faults import hold_every_gpu

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker, pytest.mark.browser]

SLURM = Backend(
    cell=(
        "import os\n"
        "print('My GPU:', os.environ['SLURMD_NODENAME'] + '/gpu' + os.environ['SLURM_JOB_GPUS'])"
    ),
    gpu=re.compile(r"My GPU: (node\d+/gpu\d+)"),
    free="1 of 4 GPUs free now",
    none_free="0 of 4 GPUs free now",
    # the hub does not run on the nodes: the node and GPU, without figures
    figures=re.compile(r"^GPU kernel node\d+ GPU \d+$"),
    shots=("57-slurm-kernel-cell", "58-slurm-kernel-waiting", "59-slurm-kernel-handed-on"),
)


@pytest.fixture
async def slurm_kernels_hub(slurm_hub, slurm_cluster, oidc_provider):
    """A Slurm hub with the shipped profiles, every GPU but one held by another member's
    plain jobs, and alice and bob (fresh accounts) signed up with credits."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "image", KERNEL_IMAGE], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    profiles = shipped_profiles()
    hub = await slurm_hub(
        profiles,
        extra_config=(
            "c.Line.update_interval = 0.5\n"
            "c.Kernels.check_interval = 0.5\n"
            "c.GPUSlurmSpawner.poll_interval = 1\n"
        ),
    )
    hold_every_gpu(slurm_cluster, slurm_cluster.fresh_member("ghj-hold"), gpus=3)
    names = (slurm_cluster.fresh_member("ghj-alice"), slurm_cluster.fresh_member("ghj-bob"))
    for name in names:
        oidc_provider.member(name)
        await grant(hub, name, "10")
    return hub, names


async def test_a_members_notebook_runs_its_gpu_kernel_as_a_slurm_job_and_bobs_waits_in_line(
    slurm_kernels_hub, tmp_path, person, screenshots
):
    hub, names = slurm_kernels_hub
    bob, _, _ = await alice_then_bob(hub, person, tmp_path, screenshots, SLURM, names)
    await shut_down_kernel(bob)  # his too: the ledger settles it
    await kernels_paid(hub, names)
