"""The kernelspecs of a member's server: the image's own ("Python 3") and one per profile that
offers GPU kernels on this hub (``GET /hub/api/gpuhub/kernels/specs``).

:class:`GPUHubKernelSpecManager` is the server's ``ServerApp.kernel_spec_manager_class``
(the image's ``jupyter_server_config.json``).  A GPU kernelspec is named
``gpuhub-<profile>``, shown as the hub names it ("Python 3 (PyTorch, 1 GPU, 1.00
credits/h)"), interrupted by message, and started by ``gpuhub-provisioner`` with its
profile; ``metadata.gpuhub`` carries its GPUs, price and the free GPUs now.  The hub's list
is kept a few seconds (``cache_seconds``), so JupyterLab's launcher and kernel picker show
a current free count when they ask again.  Outside a hub (no ``JUPYTERHUB_API_URL``), or
while the hub does not answer, only the local kernels are listed.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from traitlets import Float

from .hub import HubKernels, HubRefused, HubUnreachable

__all__ = ["PREFIX", "GPUHubKernelSpecManager", "kernelspec_of"]

#: the GPU kernelspecs' names: ``gpuhub-<profile slug>``
PREFIX = "gpuhub-"


def kernelspec_of(spec: dict) -> dict:
    """A kernel.json for one entry of the hub's ``kernels/specs``."""
    return {
        "argv": ["gpuhub-kernel", "-f", "{connection_file}"],  # run by the hub, not here
        "display_name": spec["display_name"],
        "language": "python",
        "interrupt_mode": "message",
        "env": {},
        "metadata": {
            "kernel_provisioner": {
                "provisioner_name": "gpuhub-provisioner",
                "config": {"profile": spec["profile"]},
            },
            "gpuhub": {
                key: spec.get(key)
                for key in ("gpus", "credits_per_hour", "free_now", "total", "simulated", "why_not")
            },
            "debugger": False,
        },
    }


class GPUHubKernelSpecManager(KernelSpecManager):
    """The local kernelspecs, and the hub's GPU kernels (see the module doc)."""

    cache_seconds = Float(
        3.0,
        config=True,
        help="Seconds the hub's list of GPU kernels is kept before it is asked again.",
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._hub_specs: dict[str, dict] = {}
        self._asked_at = -1e9

    def _fresh(self) -> bool:
        return time.monotonic() - self._asked_at < self.cache_seconds

    def _keep(self, specs) -> None:
        self._asked_at = time.monotonic()
        if isinstance(specs, list):
            self._hub_specs = {
                PREFIX + s["profile"]: s
                for s in specs
                if isinstance(s, dict) and isinstance(s.get("profile"), str)
            }

    async def refresh(self) -> None:
        """Ask the hub for its GPU kernels unless the list is fresh (async)."""
        if self._fresh():
            return
        try:
            self._keep(await HubKernels(timeout=5).specs())
        except (HubRefused, HubUnreachable) as e:
            self._asked_at = time.monotonic()
            self.log.warning("The hub's GPU kernels are not listed: %s", e)

    def _refresh_now(self) -> None:
        """:meth:`refresh` for a synchronous caller (jupyter_client's ``KernelManager``
        reads its kernelspec synchronously): at most 2 s."""
        if self._fresh():
            return
        hub = HubKernels()
        if not hub.api_url:
            self._asked_at = time.monotonic()
            return
        request = urllib.request.Request(
            f"{hub.api_url}/gpuhub/kernels/specs",
            headers={"Authorization": f"token {hub.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310 - the hub
                self._keep(json.loads(response.read()))
        except (OSError, ValueError, urllib.error.URLError) as e:
            self._asked_at = time.monotonic()
            self.log.warning("The hub's GPU kernels are not listed: %s", e)

    def find_kernel_specs(self) -> dict[str, str]:
        found = super().find_kernel_specs()
        from ipykernel.kernelspec import RESOURCES  # the Python logo

        for name in self._hub_specs:
            found.setdefault(name, RESOURCES)
        return found

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if not kernel_name.startswith(PREFIX):
            return super().get_kernel_spec(kernel_name)
        if kernel_name not in self._hub_specs:
            self._refresh_now()
        spec = self._hub_specs.get(kernel_name)
        if spec is None:
            raise NoSuchKernel(kernel_name)
        from ipykernel.kernelspec import RESOURCES

        return self.kernel_spec_class(resource_dir=RESOURCES, **kernelspec_of(spec))

    async def get_all_specs(self) -> dict:
        await self.refresh()
        return super().get_all_specs()
