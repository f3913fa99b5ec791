"""A GPU kernel on another machine (Slurm): its channels carried over an authenticated
websocket relay (docs: explanation/gpu-kernels, "Slurm: a relay").

On Slurm the kernel is a batch job on a GPU node, usually not the member's server's node,
in a sandbox with a network namespace of its own: no ipc socket is shared, and the
cluster's network is shared with every other member.  So each end keeps the kernel's
ZeroMQ channels on Unix (``ipc``) sockets in a private folder of its own, and a relay
carries each ZeroMQ connection, bytes unchanged, over one websocket:

- in the member's server, :class:`LocalRelay` listens on the channels' socket files in her
  private runtime folder (0700; the kernel manager's connection points there); each
  connection a client of hers makes becomes a websocket to the hub's
  ``/hub/api/gpuhub/kernels/<id>/channels/<port>`` with her server's own token (the only
  way out of her server's sandbox is the hub's API); the hub checks the token as for its
  kernels API (her server's kernels only) and carries the websocket on to the kernel's
  server port on the node (``hub_ext/kernels/relay.py``);
- in the kernel's job, ``gpuhub-kernel`` runs ipykernel on ipc sockets in a private
  folder of its sandbox (:func:`local_connection`) and serves :func:`serve_relay` on its
  server port: a websocket to ``.../relay/<port>`` is accepted only with a token of the
  kernel's own member that may reach this kernel (checked with the hub,
  ``jupyterhub.services.auth.HubAuth``: :func:`allowed`), then joined to that channel's
  socket.

No other member, on the same node or anywhere on the cluster's network, can connect,
subscribe or send to a channel: the socket files are in folders only the member's uid
enters, in sandboxes of their own, and the one port that reaches them asks the hub whose
token it is.  The folder of the kernel in her workspace (``.gpuhub/kernels/<id>/``, 0700)
keeps what Docker's :class:`~.transport.WorkspaceIPC` keeps there but the sockets: the
connection file with the key, ``control.json``, ``state.json``, ``lock``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

from .transport import CONNECTION, PORTS, SOCKETS, WorkspaceIPC, read_json, write_json

__all__ = ["LocalRelay", "WorkspaceRelay", "allowed", "local_connection", "serve_relay"]

#: websocket path of a channel, after the kernel server's base URL
CHANNEL_PATH = "relay/{port}"
#: seconds a connection waits between tries while the kernel is not reachable yet
RETRY_FIRST, RETRY_MAX = 0.5, 5.0
CHUNK = 65536
DEBUG = bool(os.environ.get("GPUHUB_RELAY_DEBUG"))


def debug(*words) -> None:
    if DEBUG:
        import sys
        import time

        print(f"gpuhub relay {time.time():.3f}:", *words, file=sys.stderr, flush=True)


def channel_ports() -> list[int]:
    return sorted(PORTS.values())


# -- the member's server -------------------------------------------------------------------


class WorkspaceRelay(WorkspaceIPC):
    """The Slurm way: the files in the workspace folder (as :class:`WorkspaceIPC`), the
    channels on ipc sockets in ``runtime`` (a private folder of the member's server) carried
    by a :class:`LocalRelay` once the hub has the kernel."""

    def __init__(self, folder: str, runtime: str | None = None):
        super().__init__(folder)
        if runtime is None:
            from jupyter_core.paths import jupyter_runtime_dir

            base = jupyter_runtime_dir()
            os.makedirs(base, mode=0o700, exist_ok=True)
            runtime = tempfile.mkdtemp(prefix="gpuhub-relay-", dir=base)  # 0700
        self.runtime = runtime
        self.relay: LocalRelay | None = None

    def prepare(self, km) -> None:
        super().prepare(km)
        km.ip = os.path.join(self.runtime, SOCKETS)
        info = read_json(self.path(CONNECTION))
        # the kernel's side binds its own sockets (local_connection): only the key and the
        # ports travel in this file
        info.update(ip="", relay=True)
        write_json(self.path(CONNECTION), info)

    def start(self, hub, kernel_id: str) -> None:
        if self.relay is None:
            self.relay = LocalRelay(os.path.join(self.runtime, SOCKETS), hub, kernel_id)
        self.relay.start()

    def cleanup(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        shutil.rmtree(self.runtime, ignore_errors=True)
        super().cleanup()


class LocalRelay:
    """Unix sockets ``<prefix>-<port>`` for the channels; each connection carried over a
    websocket to the hub's relay of kernel ``kernel_id`` (see the module doc).  While the
    kernel is not reachable (it waits for its GPU, its job starts) a connection is held
    and the websocket tried again, so ZeroMQ's handshake simply waits."""

    def __init__(self, prefix: str, hub, kernel_id: str):
        self.prefix = prefix
        self.hub = hub
        self.kernel_id = kernel_id
        self.servers: dict[int, asyncio.AbstractServer] = {}
        self._starting: asyncio.Future | None = None
        self.refused = ""  # the hub's last refusal, in words (the log)

    def url(self, port: int) -> str:
        base = self.hub.api_url.replace("http", "ws", 1)
        return f"{base}/gpuhub/kernels/{self.kernel_id}/channels/{port}"

    def start(self) -> None:
        """Listen on the channels' socket files; again after a restart (jupyter_client
        removes a kernel's ipc files whenever it stops one, restarts included)."""
        if self._starting is not None and not self._starting.done():
            return
        self._starting = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        for port in channel_ports():
            path = f"{self.prefix}-{port}"
            if port in self.servers and os.path.exists(path):
                continue
            if port in self.servers:
                self.servers.pop(port).close()
            server = await asyncio.start_unix_server(
                lambda r, w, port=port: self._carry(port, r, w), path
            )
            os.chmod(path, 0o600)
            self.servers[port] = server

    async def _connect(self, port: int):
        """A websocket to the hub for ``port``; raises once the hub refuses it."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        request = HTTPRequest(
            self.url(port),
            headers={"Authorization": f"token {self.hub.token}"},
            connect_timeout=10,
            request_timeout=20,
        )
        return await websocket_connect(request, max_message_size=64 * 2**20)

    async def _carry(self, port: int, reader, writer) -> None:
        """One client connection: what it sends is kept while the websocket is tried (again
        every few seconds while the kernel is not reachable), then both ways carried."""
        pending = bytearray()

        async def keep():  # the client's bytes (ZeroMQ's greeting) until connected
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    return
                pending.extend(data)

        keeping = asyncio.ensure_future(keep())
        ws, delay = None, RETRY_FIRST
        while not keeping.done():  # done: the client left (its handshake timed out)
            try:
                ws = await self._connect(port)
                break
            except Exception as e:  # noqa: BLE001 - not reachable yet: try again
                self.refused = str(e)
                debug("local", port, "not yet:", e)
            await asyncio.wait([keeping], timeout=delay)
            delay = min(delay * 2, RETRY_MAX)
        client_left = keeping.done()
        keeping.cancel()
        debug("local", port, "connected" if ws else "gave up", len(pending), client_left)
        if ws is None:
            writer.close()
            return
        try:
            if pending:
                await ws.write_message(bytes(pending), binary=True)
            if client_left:
                return
            await asyncio.gather(_to_ws(reader, ws), _from_ws(ws, writer))
        finally:
            debug("local", port, "closed")
            ws.close()
            writer.close()

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers = {}
        if self._starting is not None:
            self._starting.cancel()


async def _to_ws(reader: asyncio.StreamReader, ws) -> None:
    """What ``reader`` gives, to the websocket ``ws`` (a client's, or a handler: both
    have ``write_message`` and ``close``), which is closed at the end."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            await ws.write_message(data, binary=True)
    except Exception:  # noqa: BLE001 - either side gone: the pair ends
        pass
    finally:
        ws.close()


async def _from_ws(ws, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await ws.read_message()
            if data is None:
                break
            writer.write(data if isinstance(data, bytes) else data.encode())
            await writer.drain()
    except Exception:  # noqa: BLE001
        pass
    finally:
        writer.close()


# -- the kernel's job ------------------------------------------------------------------------


def local_connection(info: dict) -> tuple[dict, str]:
    """The connection ipykernel runs on in the kernel's sandbox, from the workspace's
    connection file ``info`` (its key and ports): ipc sockets in a new private folder;
    returns it and the folder."""
    folder = tempfile.mkdtemp(prefix="gpuhub-kernel-")  # 0700, the sandbox's own /tmp
    local = {k: v for k, v in info.items() if k != "relay"}
    local.update(transport="ipc", ip=os.path.join(folder, SOCKETS))
    write_json(os.path.join(folder, CONNECTION), local)
    return local, folder


def allowed(model: dict | None, owner: str, server_name: str) -> bool:
    """Whether the hub's answer for a token (``HubAuth.user_for_token``) lets it reach the
    channels of ``owner``'s kernel server ``server_name``: the owner's own token, with
    access to this server or the GPU kernels scope for her (her server's token)."""
    from jupyterhub.services.auth import check_scopes

    if not model or model.get("kind", "user") != "user" or model.get("name") != owner:
        return False
    needed = {
        f"access:servers!server={owner}/{server_name}",
        f"custom:gpuhub:kernels!user={owner}",
    }
    return bool(check_scopes(needed, set(model.get("scopes") or ())))


def serve_relay(where: tuple[str, int], prefix: str, answer) -> None:
    """Serve the kernel's server port in a thread of its own: ``answer()`` (a dict, the
    readiness answer) on any plain request; the websocket ``.../relay/<port>`` joined to
    the channel socket ``<prefix>-<port>`` for a token :func:`allowed` takes."""
    import json
    import threading

    def run():
        import tornado.web
        import tornado.websocket
        from jupyterhub.services.auth import HubAuth

        owner = os.environ.get("JUPYTERHUB_USER", "")
        server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        auth = HubAuth(
            api_url=os.environ.get("JUPYTERHUB_API_URL", ""),
            api_token=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
            cache_max_age=60,
        )
        ports = {str(p) for p in channel_ports()}

        class Channel(tornado.websocket.WebSocketHandler):
            unix = None

            async def get(self, port):
                header = self.request.headers.get("Authorization", "")
                token = (
                    header.split(None, 1)[1]
                    if header.lower().startswith(("token ", "bearer "))
                    else ""
                )
                model = None
                if token and port in ports:
                    try:
                        model = await auth.user_for_token(token, sync=False)
                    except Exception:  # noqa: BLE001 - the hub did not answer: no
                        model = None
                if not allowed(model, owner, server_name):
                    self.set_status(403)
                    self.finish({"status": 403, "message": "Not your GPU kernel."})
                    return
                try:
                    self.unix = await asyncio.open_unix_connection(f"{prefix}-{port}")
                except OSError as e:  # ipykernel between two runs: the client tries again
                    debug("kernel", port, "no socket:", e)
                    self.set_status(503)
                    self.finish({"status": 503, "message": "The kernel is restarting."})
                    return
                await super().get(port)

            def check_origin(self, origin):
                return False  # never a browser's page

            def open(self, port):
                debug("kernel", port, "open")
                asyncio.ensure_future(self._pump())

            async def _pump(self):
                await _to_ws(self.unix[0], self)  # the socket's bytes, until it closes
                debug("kernel", "socket closed")

            async def on_message(self, message):
                _, writer = self.unix
                writer.write(message if isinstance(message, bytes) else message.encode())
                await writer.drain()

            def on_close(self):
                if self.unix is not None:
                    self.unix[1].close()

        class Answer(tornado.web.RequestHandler):
            def get(self, *args):
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(answer()))

            head = post = put = delete = get

        app = tornado.web.Application(
            [(r".*/relay/(\d+)", Channel), (r"(.*)", Answer)],
            websocket_max_message_size=64 * 2**20,
        )

        async def main():
            app.listen(where[1], where[0])
            await asyncio.Event().wait()

        asyncio.run(main())

    threading.Thread(target=run, daemon=True).start()
