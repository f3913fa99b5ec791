"""The hub's part of a GPU kernel's relay (Slurm; docs: explanation/gpu-kernels, "Slurm: a
relay"): ``/hub/api/gpuhub/kernels/<id>/channels/<port>``, a websocket.

On Slurm a member's server runs in a sandbox whose only way out is the hub's API, and her
kernel runs in a batch job on another node.  Her server's relay
(``gpuhub_kernels.relay.LocalRelay``) carries each ZeroMQ connection of a kernel channel
over a websocket to this endpoint, with her server's own token; the hub checks it as it
checks the kernels API (the scope ``custom:gpuhub:kernels`` for her, a server's token for
the kernels that server started: another member's kernel is 404), then opens a websocket
to the kernel's server port (``.../relay/<port>``, which checks the same token with the hub
itself: ``gpuhub_kernels.relay.allowed``) and carries bytes both ways, unchanged.  A kernel
that is not running yet is 409 in words: her relay tries again.
"""

from __future__ import annotations

import asyncio

from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClosedError, WebSocketHandler, websocket_connect

from .handlers import KERNEL_ID, KernelsBase

__all__ = ["KernelChannelHandler", "handlers"]

#: the channels' "ports" (gpuhub_kernels.transport.PORTS)
CHANNELS = r"[1-5]"
MAX_MESSAGE_BYTES = 64 * 2**20


class KernelChannelHandler(KernelsBase, WebSocketHandler):
    """One ZeroMQ connection of a kernel channel, carried to the kernel's job."""

    upstream = None

    async def get(self, kernel_id: str, port: str):
        row = self.row_or_404(kernel_id)
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise web.HTTPError(400, "A GPU kernel's channel is a websocket.")
        if row.state == "ended":  # its server is gone: nothing to look up, nor to wait for
            raise web.HTTPError(410, f"The GPU kernel {kernel_id} has ended.")
        owner = self.owner(row)
        known = owner is not None and row.server_name in owner.orm_spawners
        spawner = owner.spawners[row.server_name] if known else None
        if row.state != "running" or spawner is None or not spawner.ready or spawner.server is None:
            raise web.HTTPError(409, f"The GPU kernel {kernel_id} is not running yet.")
        server = spawner.server
        url = url_path_join(server.host.replace("http", "ws", 1), server.base_url, "relay", port)
        token = self.get_auth_token() or ""
        try:
            self.upstream = await websocket_connect(
                HTTPRequest(
                    url,
                    headers={"Authorization": f"token {token}"},
                    connect_timeout=10,
                    request_timeout=20,
                ),
                max_message_size=MAX_MESSAGE_BYTES,
            )
        except Exception as e:  # noqa: BLE001 - the job's port refused or did not answer
            self.log.info("GPU kernel %s: its relay did not answer: %s", kernel_id, e)
            raise web.HTTPError(
                503, f"The GPU kernel {kernel_id} did not answer; try again."
            ) from None
        await WebSocketHandler.get(self, kernel_id, port)

    def check_xsrf_cookie(self):
        """A token's request (never a browser's page: :meth:`check_origin`)."""

    def check_origin(self, origin):
        return False

    def open(self, kernel_id: str, port: str):
        self.log.debug("GPU kernel %s: channel %s relayed", kernel_id, port)
        asyncio.ensure_future(self._from_kernel())

    async def _from_kernel(self):
        try:
            while True:
                data = await self.upstream.read_message()
                if data is None:
                    break
                await self.write_message(data, binary=True)
        except WebSocketClosedError:
            pass
        self.close()

    async def on_message(self, message):
        try:
            await self.upstream.write_message(message, binary=True)
        except WebSocketClosedError:
            self.close()

    def on_close(self):
        self.log.debug("GPU kernel relay closed: %s", self.request.path)
        if self.upstream is not None:
            self.upstream.close()


handlers = [
    (rf"/api/gpuhub/kernels/({KERNEL_ID})/channels/({CHANNELS})", KernelChannelHandler),
]
