"""The command line every server starts with asks for kernels on Unix sockets
(``kernel_transport``, hub_ext/spawn/core.py), whatever the image; the real servers are
tests/test_kernel_isolation_hub.py."""

from __future__ import annotations

import pytest
from traitlets import TraitError

from hub_ext.docker.spawner import GPUDockerSpawner
from hub_ext.slurm.spawner import GPUSlurmSpawner
from tests.fixtures.members import fake_user


@pytest.mark.parametrize("cls", [GPUDockerSpawner, GPUSlurmSpawner])
def test_the_server_is_told_to_put_kernels_on_unix_sockets_after_the_sites_args(cls):
    spawner = cls(user=fake_user(), args=["--debug"])
    assert spawner.get_args() == ["--debug", "--KernelManager.transport=ipc"]
    assert spawner.args == ["--debug"]  # JupyterHub's own list is left as configured


def test_the_slurm_job_runs_the_server_with_it():
    spawner = GPUSlurmSpawner(user=fake_user())
    assert spawner.cmd_formatted_for_batch().endswith(
        "jupyterhub-singleuser --KernelManager.transport=ipc"
    )


@pytest.mark.parametrize("cls", [GPUDockerSpawner, GPUSlurmSpawner])
def test_a_site_can_leave_it_to_the_image_or_ask_for_tcp(cls):
    assert cls(user=fake_user(), kernel_transport="").get_args() == []
    assert cls(user=fake_user(), kernel_transport="TCP").get_args() == [
        "--KernelManager.transport=tcp"
    ]
    with pytest.raises(TraitError, match="kernel_transport"):
        cls(user=fake_user(), kernel_transport="udp")
