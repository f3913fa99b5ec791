"""Every kernel of the image's ``python3`` kernelspec on Unix sockets in the member's runtime
folder, whichever tool starts it: the server (JupyterLab), ``jupyter nbconvert --execute``,
``jupyter execute``, papermill, ``jupyter console``.

The server reads ``KernelManager.transport = "ipc"`` from its configuration
(``/etc/jupyter/jupyter_server_config.json``), but the other tools read other files, or
none (papermill), and start their kernels on loopback TCP ports, open to every process that
shares the network namespace. This kernel provisioner (jupyter_client's ``LocalProvisioner``,
named in the kernelspec's ``metadata.kernel_provisioner``) turns such a start into an ``ipc``
one before the connection file is written: the connection file and the socket files go to
the member's runtime folder (``jupyter_runtime_dir()``, mode 0700), never to the current
folder (the ``ipc`` default of a kernel without a connection file) or ``/tmp``.

Registered as ``gpuhub-private-sockets`` in the ``jupyter_client.kernel_provisioners`` entry
points (the image's ``gpuhub_kernel_sockets-1.dist-info``; images/README.md, "Kernels").
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from jupyter_client.provisioning import LocalProvisioner

NAME = "gpuhub-private-sockets"


def private_runtime_dir() -> str:
    """The member's runtime folder, made mode 0700 when missing."""
    from jupyter_core.paths import jupyter_runtime_dir

    runtime = jupyter_runtime_dir()
    os.makedirs(runtime, mode=0o700, exist_ok=True)
    return runtime


def use_private_sockets(km) -> None:
    """Make the kernel manager ``km`` start its kernel on ``ipc`` sockets named after a
    connection file in the member's runtime folder.  A kernel already on ``ipc`` with an
    absolute socket path (the server's kernels) is left as it is."""
    if km.transport == "ipc" and os.path.isabs(km.ip) and km.connection_file:
        return
    runtime = private_runtime_dir()
    if not km.connection_file or not os.path.isabs(km.connection_file):
        km.connection_file = os.path.join(runtime, f"kernel-{uuid.uuid4()}.json")
    km.transport = "ipc"
    km.cache_ports = False  # a TCP port cache has nothing to say about socket files
    km.ip = os.path.splitext(km.connection_file)[0] + "-ipc"


class PrivateSocketsProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, with the kernel on private Unix sockets."""

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        if self.parent is not None:
            use_private_sockets(self.parent)
        return await super().pre_launch(**kwargs)
