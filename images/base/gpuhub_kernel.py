"""The Python kernel of gpuhub images: ipykernel's own, with JupyterLab's debugger refused
and its fork pipe on a private Unix socket.

ipykernel answers a ``debug_request`` by starting debugpy, whose adapter listens on a
loopback TCP port with no token for its clients, for the rest of the kernel's life. Where
servers share a network namespace (Docker host networking, the jobs of a Slurm node) any
other member could attach to it and run code in this kernel as its owner. So this kernel
reports no debugger (``kernel_info``: no ``"debugger"`` feature) and answers every
``debug_request`` with ``success: false``; debugpy is never started. A site whose servers
each have their own network namespace may turn it back on (images/README.md, "Kernels").

ipykernel's fork pipe (``IOPubThread``: a ZeroMQ PULL socket through which the kernel's
forked child processes send their output) listens on ``tcp://127.0.0.1:<random port>``,
takes messages of any size from anyone, and prints a message without the kernel's key whole
to the kernel's stderr (the server's log, a job's log). :class:`PrivateForkPipe` binds it to
``ipc://`` in a folder of its own (mode 0700) in the member's runtime folder, takes messages
of at most :data:`FORK_PIPE_MAX_BYTES` (``zmq.MAXMSGSIZE``: a longer one disconnects its
sender before it is read) and drops one without the key silently.

Both are made the kernel's by ``$PREFIX/etc/ipython/ipython_kernel_config.py``, which every
``python -m ipykernel_launcher`` of the image reads before it opens its sockets:
``c.IPKernelApp.kernel_class`` and :func:`use_private_fork_pipe` (images/README.md, "Kernels").
"""

from __future__ import annotations

import atexit
import hmac
import os
import shutil
import sys
import tempfile
import warnings
from typing import Any

import zmq
from ipykernel.iostream import IOPubThread
from ipykernel.ipkernel import IPythonKernel
from zmq.eventloop.zmqstream import ZMQStream

#: The largest message, bytes, the fork pipe takes (a child's output comes in pieces far
#: smaller: ipykernel flushes a stream every 0.2 s); ZeroMQ disconnects a sender of a
#: longer one as soon as it announces the length, before reading it.
FORK_PIPE_MAX_BYTES = 16 * 2**20

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


class PrivateForkPipe(IOPubThread):
    """ipykernel's IOPub thread with its fork pipe on a private Unix socket, bounded and
    silent (module doc)."""

    _pipe_url = ""

    def _setup_pipe_in(self):
        self._pipe_uuid = os.urandom(16)
        self._pipe_port = None
        pipe_in = self.socket.context.socket(zmq.PULL)
        pipe_in.linger = 0
        pipe_in.setsockopt(zmq.MAXMSGSIZE, FORK_PIPE_MAX_BYTES)
        try:
            from jupyter_core.paths import jupyter_runtime_dir

            runtime = jupyter_runtime_dir()
            os.makedirs(runtime, mode=0o700, exist_ok=True)
            folder = tempfile.mkdtemp(prefix="fork-pipe-", dir=runtime)  # mode 0700
            atexit.register(shutil.rmtree, folder, True)
            self._pipe_url = f"ipc://{folder}/pipe"
            pipe_in.bind(self._pipe_url)
        except (OSError, zmq.ZMQError) as e:
            # e.g. a runtime folder whose path is too long for a Unix socket: the output of
            # forked children is lost, as ipykernel does when its TCP bind fails
            warnings.warn(
                f"No fork pipe ({e}): output of forked child processes is not shown",
                stacklevel=2,
            )
            self._pipe_flag = False
            pipe_in.close()
            return
        self._pipe_in = ZMQStream(pipe_in, self.io_loop)
        self._pipe_in.on_recv(self._handle_pipe_msg)

    def _setup_pipe_out(self):
        ctx = zmq.Context()  # a new context after the fork, as ipykernel does
        pipe_out = ctx.socket(zmq.PUSH)
        pipe_out.linger = 3000
        pipe_out.connect(self._pipe_url)
        return ctx, pipe_out

    def _handle_pipe_msg(self, msg):
        """Pass a child's output on; drop, without a word, a message lacking the key."""
        if not self._pipe_flag or not self._is_master_process():
            return
        if not msg or not hmac.compare_digest(bytes(msg[0]), self._pipe_uuid):
            return
        self.send_multipart(msg[1:])


def use_private_fork_pipe() -> None:
    """Make :class:`PrivateForkPipe` the IOPub thread of the kernel this process starts
    (``IPKernelApp.init_iopub`` makes it from ``ipykernel.kernelapp.IOPubThread``).  Called
    from the image's ``ipython_kernel_config.py``, before the kernel opens its sockets."""
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    if kernelapp is None:
        import ipykernel.kernelapp as kernelapp
    kernelapp.IOPubThread = PrivateForkPipe
