"""The Python kernel of gpuhub images: ipykernel's own, with JupyterLab's debugger refused.

ipykernel answers a ``debug_request`` by starting debugpy, whose adapter listens on a
loopback TCP port with no token for its clients, for the rest of the kernel's life. Where
servers share a network namespace (Docker host networking, the jobs of a Slurm node) any
other member could attach to it and run code in this kernel as its owner. So this kernel
reports no debugger (``kernel_info``: no ``"debugger"`` feature) and answers every
``debug_request`` with ``success: false``; debugpy is never started. A site whose servers
each have their own network namespace may turn it back on (images/README.md, "Kernels").

Made the kernel of every ``python -m ipykernel_launcher`` in the image by
``$PREFIX/etc/ipython/ipython_kernel_config.py`` (``c.IPKernelApp.kernel_class``).
"""

from __future__ import annotations

from typing import Any

from ipykernel.ipkernel import IPythonKernel

REFUSAL = (
    "The debugger is off on this hub: its port would be open to every other server on the "
    "same network (images/README.md, 'Kernels')."
)


class GPUHubKernel(IPythonKernel):
    """ipykernel's IPythonKernel without the debugger."""

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = super().kernel_info
        info["supported_features"] = [
            feature for feature in info.get("supported_features", []) if feature != "debugger"
        ]
        info["debugger"] = False  # the key older JupyterLab versions read
        return info

    async def do_debug_request(self, msg: dict) -> dict:
        """Refuse a Debug Adapter Protocol request, as a DAP error response."""
        return {
            "type": "response",
            "seq": 0,
            "request_seq": msg.get("seq", 0),
            "success": False,
            "command": msg.get("command", ""),
            "message": REFUSAL,
        }
