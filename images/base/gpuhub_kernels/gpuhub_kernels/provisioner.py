"""``gpuhub-provisioner``: a kernel provisioner that runs a notebook's kernel on a GPU, in a
container the hub starts (docs: explanation/gpu-kernels).

Jupyter's own extension point (``jupyter_client.provisioning.KernelProvisionerBase``,
entry point group ``jupyter_client.kernel_provisioners``), selected per kernelspec by
:class:`gpuhub_kernels.specs.GPUHubKernelSpecManager`, so a local "Python 3" and GPU
kernels live side by side in one server.  The provisioner never holds Docker's socket or
Slurm's credentials: it asks the hub, with the server's own token (:mod:`.hub`).

A kernel's life, as jupyter_client's ``KernelManager`` drives it:

- start (``pre_launch``, ``launch_kernel``): a connection folder of the member's own in
  her workspace and the connection in it (:class:`~.transport.WorkspaceIPC` on Docker;
  :class:`~.relay.WorkspaceRelay` on Slurm, whose channels a relay carries:
  :func:`~.transport.transport_for`); then ``POST /hub/api/gpuhub/kernels``.  It
  returns at once, waiting in line or not: the
  channels are known before the kernel runs, and ZMQ keeps what is sent until the kernel
  binds, so JupyterLab never gives up on a kernel that waits for its GPU; the hub's
  refusal (no credits, no such profile, limits) is raised in its words.
- ``poll``: alive while it waits or runs; the run of ipykernel's exit code once it exited
  (a shutdown or restart the server asked for, or a crash); 1 once the hub ended the
  kernel (shut down, idle, its container died: why is in ``reason``) or its container is
  gone.  A kernel the hub ended is reported dead at once, its restarter stopped first
  (:meth:`GPUHubProvisioner._ended_by_hub`): JupyterLab says "It will restart
  automatically" for any kernel its restarter tries again, and this one never comes back.
- restart (the member's, or the restarter's after a crash): the same container runs
  ipykernel again on the same connection, so the GPU stays.  A restart after the hub
  ended the kernel is refused with the hub's words and the kernel reported dead: the
  restarter never starts a second GPU kernel behind the member's back.
- interrupt: ``interrupt_mode`` "message" (the kernelspec): on the control channel.
- shutdown: ``DELETE`` at the hub (it leaves the line, or its server stops: the GPU goes
  back, the unused interval is refunded), then the folder is removed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from jupyter_client.provisioning import KernelProvisionerBase
from traitlets import Float, Unicode, default

from .hub import HubKernels, HubRefused, HubUnreachable
from .transport import Transport, transport_for

__all__ = ["GPUHubProvisioner"]


def relative_to(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` ("" for ``root`` itself), or None when outside it."""
    path, root = os.path.normpath(path), os.path.normpath(root)
    if path == root:
        return ""
    if path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1 :]
    return None


class GPUHubProvisioner(KernelProvisionerBase):
    """A GPU kernel, started and stopped by the hub (see the module doc)."""

    profile = Unicode(
        "",
        config=True,
        help="The hub's profile this kernel runs on (the kernelspec's provisioner config).",
    )
    workspace = Unicode(
        config=True,
        help="""Where the member's workspace is mounted in this server (and in the
        kernel's container): $GPUHUB_WORKSPACE_MOUNT, set by the hub.""",
    )
    hub_poll_interval = Float(
        2.0,
        config=True,
        help="Seconds between the provisioner's questions to the hub about its kernel.",
    )
    gone_wait = Float(
        10.0,
        config=True,
        help="""Seconds the provisioner waits for the hub's word on a kernel whose
        container it finds gone before it reports the kernel dead without it.""",
    )

    @default("workspace")
    def _default_workspace(self):
        return os.environ.get("GPUHUB_WORKSPACE_MOUNT") or os.path.expanduser("~/work")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hub = HubKernels()
        #: the hub's id of this kernel (12 hex), once the hub accepted it
        self.hub_kernel_id: str | None = None
        #: the hub's last answer about it (``GET /hub/api/gpuhub/kernels/<id>``)
        self.last_model: dict | None = None
        #: the hub's ``ended`` ({"reason", "message"}) once it ended the kernel
        self.ended: dict | None = None
        self.transport: Transport | None = None
        #: the run of ipykernel this server asked for last (1: the first)
        self.generation = 0
        self.launched = False
        self._asked_at = 0.0
        self._asking: asyncio.Future | None = None
        self._gone_since: float | None = None
        self._request: dict = {}
        #: the server is shutting the kernel down itself (its own shutdown follows)
        self._stopping = False

    # -- start ----------------------------------------------------------------------------

    @property
    def has_process(self) -> bool:
        return self.launched

    def _paths(self, kwargs: dict) -> dict:
        """The notebook and the working folder, relative to the workspace ("" outside it)."""
        root = getattr(self.parent.parent, "root_dir", None) or os.getcwd()
        session = (kwargs.get("env") or {}).get("JPY_SESSION_NAME", "")
        notebook = relative_to(os.path.join(root, session), self.workspace) if session else ""
        cwd = relative_to(str(kwargs.get("cwd") or root), self.workspace)
        return {"notebook": notebook or "", "cwd": cwd or ""}

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        if self.ended is not None:
            self._refuse_restart()
        if self.hub_kernel_id is None:  # the first start: the connection, in the workspace
            km = self.parent
            folder = os.path.join(self.workspace, ".gpuhub", "kernels", self.kernel_id)
            transport = transport_for(folder)
            transport.make_folder()
            self.transport = transport
            transport.prepare(km)
            km.write_connection_file()
            self.connection_info = km.get_connection_info()
            self._request = {
                **self._paths(kwargs),
                "connection_dir": relative_to(folder, self.workspace),
            }
        kwargs.pop("extra_arguments", None)
        return await super().pre_launch(cmd=list(self.kernel_spec.argv), **kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        if self.hub_kernel_id is None:
            try:
                model = await self.hub.create(self.profile, **self._request)
            except (HubRefused, HubUnreachable) as e:
                self.transport.cleanup()
                raise RuntimeError(str(e)) from None
            self.hub_kernel_id, self.last_model = model["id"], model
            self.transport.start(self.hub, self.hub_kernel_id)
            self._asked_at = time.monotonic()
            self.generation = 1
            self.log.info(
                "GPU kernel %s (hub %s, %s): %s",
                self.kernel_id,
                self.hub_kernel_id,
                self.profile,
                (model.get("place") or {}).get("message") or model.get("state"),
            )
        else:  # a restart: the same container runs ipykernel again, the GPU stays
            self.generation = max(self.generation, self.transport.state().get("generation", 0)) + 1
            self.transport.control(want=self.generation)
            self.transport.start(self.hub, self.hub_kernel_id)  # its sockets again
        self.launched = True
        return self.connection_info

    async def post_launch(self, **kwargs: Any) -> None:
        # the restarter gave up on the kernel (it died again and again): give its GPU back
        self.parent.add_restart_callback(self._restarts_failed, "dead")

    def _restarts_failed(self) -> None:
        if self.hub_kernel_id is not None and self.ended is None:
            asyncio.ensure_future(self._shut_down())

    # -- what it is doing -------------------------------------------------------------------

    async def hub_model(self, check: bool = False) -> dict | None:
        """Ask the hub about the kernel now (``check``: and have it look at the kernel's
        container first); the last answer when the hub does not answer.  Sets
        :attr:`ended` (and the kernel's ``reason``) once the hub ended it."""
        if self.hub_kernel_id is None:
            return None
        self._asked_at = time.monotonic()
        try:
            self.last_model = await self.hub.get(self.hub_kernel_id, check=check)
        except HubRefused as e:
            if e.status == 404:  # forgotten by the hub: it ended long ago
                self.last_model = {
                    "state": "ended",
                    "ended": {"reason": "gone", "message": str(e)},
                }
        except HubUnreachable:
            pass  # a hub restarting: the kernel goes on meanwhile
        model = self.last_model
        if model and model.get("state") == "ended" and self.ended is None:
            ended = {"reason": "ended", "message": "The GPU kernel ended."}
            self._ended_by_hub(model.get("ended") or ended)
        return model

    def _ended_by_hub(self, ended: dict) -> None:
        """The kernel ended outside this server's own shutdown (the hub's idle time-out,
        an admin's Stop, its container died): keep why (``ended``: the hub's
        ``{"reason", "message"}``, also the kernel's ``reason``) and report the kernel dead
        now, as jupyter_client's restarter does when it gives up, so that the server drops
        it and JupyterLab shows it dead.  The restarter is stopped first: it would try a
        restart (refused: :meth:`_refuse_restart`), and JupyterLab answers a restart it did
        not ask for with "It will restart automatically"."""
        self.ended = ended
        km = self.parent
        km.reason = ended.get("message", "")
        self.log.warning("GPU kernel %s ended: %s", self.kernel_id, km.reason)
        if self._stopping:
            return  # the server's own shutdown goes on
        km.stop_restarter()
        asyncio.get_running_loop().call_soon(self._report_dead)

    def _report_dead(self) -> None:
        """The restarter's "dead" callbacks (the server drops the kernel, its websockets
        send the status ``dead``); the connection folder goes, its kernel side is gone."""
        self.launched = False
        if self.transport is not None:
            self.transport.cleanup()
        restarter = getattr(self.parent, "_restarter", None)
        if restarter is not None:
            restarter._fire_callbacks("dead")

    def _ask_soon(self, check: bool = False) -> None:
        """Ask the hub in the background, at most every ``hub_poll_interval`` seconds
        (``check``: now, the container looks gone).  :meth:`poll` never waits for the
        hub: Jupyter's restarter decides between its own check of a shutdown under way
        and its poll, so a poll that waited could let it restart a kernel being shut
        down."""
        if self._asking is not None and not self._asking.done():
            return
        if check or time.monotonic() - self._asked_at >= self.hub_poll_interval:
            self._asked_at = time.monotonic()
            self._asking = asyncio.ensure_future(self.hub_model(check=check))

    async def poll(self) -> int | None:
        if not self.launched:
            return 0
        self._ask_soon()
        if self.ended is not None:
            return 1
        if not self.transport.started():
            return None  # waiting for its GPU, or its container starting
        if not self.transport.alive():  # its container is gone: the hub says why
            self._gone_since = self._gone_since or time.monotonic()
            if time.monotonic() - self._gone_since < self.gone_wait:
                self._ask_soon(check=True)
                return None
            self._ended_by_hub({"reason": "died", "message": "The GPU kernel's container ended."})
            return None  # reported dead by _ended_by_hub, not by the restarter polling now
        state = self.transport.state()
        if state.get("generation", 0) >= self.generation and state.get("alive") is False:
            code = state.get("exit_code")
            return code if isinstance(code, int) and code != 0 else 1
        return None

    async def wait(self) -> int | None:
        while True:
            status = await self.poll()
            if status is not None:
                return status
            await asyncio.sleep(0.1)

    # -- signals and stops ------------------------------------------------------------------

    async def send_signal(self, signum: int) -> None:
        if self.transport is None or signum == 0:
            return
        if signum == signal.SIGINT:
            self.transport.control(interrupt=time.time())
        else:
            self.transport.control(kill=self.generation)

    async def kill(self, restart: bool = False) -> None:
        if restart:
            await self.send_signal(signal.SIGKILL)
        else:
            await self._shut_down()

    async def terminate(self, restart: bool = False) -> None:
        await self.kill(restart)

    async def shutdown_requested(self, restart: bool = False) -> None:
        if not restart:
            await self._shut_down()

    async def _shut_down(self) -> None:
        """Tell the kernel's side to stop and the hub to end the kernel (idempotent)."""
        self._stopping = True
        if self.transport is not None and os.path.isdir(self.transport.folder):
            self.transport.control(stop=True)
        if self.hub_kernel_id is not None and self.ended is None:
            try:
                await self.hub.delete(self.hub_kernel_id)
            except (HubRefused, HubUnreachable) as e:
                self.log.warning("GPU kernel %s: the hub did not end it: %s", self.kernel_id, e)
            await self.hub_model()

    async def cleanup(self, restart: bool = False) -> None:
        if restart or not self.launched:
            return
        await self._shut_down()
        if self.transport is not None:
            self.transport.cleanup()
        self.launched = False

    def _refuse_restart(self) -> None:
        """A restart of a kernel the hub ended: refused, the kernel reported dead (never a
        second GPU kernel behind the member's back)."""
        message = (self.ended or {}).get("message") or "The GPU kernel ended."
        self._report_dead()
        raise RuntimeError(f"{message} It is not restarted: choose the GPU kernel again.")

    # -- persistence ------------------------------------------------------------------------

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, 10.0)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update(
            hub_kernel_id=self.hub_kernel_id,
            folder=getattr(self.transport, "folder", None),
            runtime=getattr(self.transport, "runtime", None),
            generation=self.generation,
        )
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.hub_kernel_id = provisioner_info.get("hub_kernel_id")
        if provisioner_info.get("folder"):
            self.transport = transport_for(
                provisioner_info["folder"], provisioner_info.get("runtime")
            )
            if self.hub_kernel_id is not None:
                self.transport.start(self.hub, self.hub_kernel_id)
        self.generation = int(provisioner_info.get("generation") or 0)
        self.launched = self.hub_kernel_id is not None
