"""``gpuhub-kernel``: a GPU kernel's container command (the hub starts it in place of
jupyterhub-singleuser; docs: explanation/gpu-kernels).

The kernel comes in ``GPUHUB_KERNEL`` (JSON, built by the hub: ``id``, ``parent``,
``notebook``, ``cwd``, ``connection_dir``; paths relative to the member's workspace,
mounted at ``GPUHUB_WORKSPACE_MOUNT`` here and in her server).  In its connection folder
(:mod:`gpuhub_kernels.transport`) it

1. holds ``lock`` (``flock``) for as long as it lives: the member's server sees at once
   when this container is gone;
2. runs ipykernel on ``connection.json`` (written by her server) in ``cwd``: the image's
   own Python kernel, its channels ipc sockets in that folder; it writes ``state.json``
   (the run, ``generation``; ``alive``; ``exit_code``; ``bound`` once the sockets exist);
3. answers every HTTP request on the server's port (``--ip=``/``--port=`` as the hub passes
   them) with 200 once the first run's sockets are bound: the hub's readiness; on Slurm
   (the connection file says ``relay``) ipykernel's sockets are in a private folder of
   the sandbox instead, and the port also serves their authenticated websocket relay
   (:mod:`gpuhub_kernels.relay`);
4. runs ipykernel again when the server asks (``control.json`` ``want``: a restart, the
   container and its GPU kept), interrupts it (``interrupt``), kills a run (``kill``) and,
   on ``stop`` (a shutdown), ends it and waits for the hub to stop the container;
5. reports activity to the hub while cells run (JupyterHub's ``POST
   /hub/api/users/<name>/activity`` for its own server, with its own token), so the GPU
   kernels' idle time-out counts from the last cell.

SIGTERM (the hub stopping the kernel) ends ipykernel at once and exits 0.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time

from .transport import CONNECTION, CONTROL, LOCK, STATE, read_json, write_json

# http.server, urllib.request, zmq and datetime are imported once ipykernel is started:
# nothing before it but what reading the folder needs (the kernel's first answer waits)

__all__ = ["main"]

#: seconds between two activity reports while cells run
ACTIVITY_INTERVAL = float(os.environ.get("GPUHUB_KERNEL_ACTIVITY_INTERVAL", "30"))
#: seconds a stopped kernel waits for the hub to stop its container
STOP_LINGER = 60.0
TICK = 0.02


def address(argv: list[str]) -> tuple[str, int]:
    """Where to answer HTTP: ``--ip=``/``--port=``, else ``JUPYTERHUB_SERVICE_URL``."""
    import urllib.parse

    ip, port = "", 0
    for arg in argv:
        if arg.startswith("--ip="):
            ip = arg.split("=", 1)[1]
        elif arg.startswith("--port="):
            port = int(arg.split("=", 1)[1])
    if not port:
        url = urllib.parse.urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", ""))
        ip, port = ip or url.hostname or "", url.port or 8888
    return ip or "0.0.0.0", port


class Runner:
    """One GPU kernel's runs of ipykernel (see the module doc)."""

    def __init__(self, kernel: dict, root: str):
        self.kernel = kernel
        self.folder = os.path.join(root, kernel["connection_dir"])
        cwd = os.path.join(root, kernel.get("cwd") or "")
        self.cwd = cwd if os.path.isdir(cwd) else root
        self.generation = 0
        self.child: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.busy_since: float | None = None
        self.http = None  # the readiness answer (http.server), once the sockets are bound
        #: the connection file ipykernel runs on: the folder's, or on Slurm a private one
        #: in the sandbox whose channels the relay carries (gpuhub_kernels.relay)
        self.connection = self.path(CONNECTION)
        self.relay = False
        self._interrupt = None

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    # -- the folder ------------------------------------------------------------------------

    def hold_lock(self) -> int:
        fd = os.open(self.path(LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd  # kept open: held until this process ends

    def write_state(self, **state) -> None:
        write_json(self.path(STATE), {"generation": self.generation, **state})

    def control(self) -> dict:
        return read_json(self.path(CONTROL))

    def sockets(self, info: dict) -> list[str]:
        ports = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
        return [f"{info['ip']}-{info[p]}" for p in ports]

    def bound(self, info: dict, since_ns: int) -> bool:
        """Whether this run's ipc sockets exist (made after ``since_ns``)."""
        try:
            return all(os.stat(s).st_ctime_ns >= since_ns for s in self.sockets(info))
        except OSError:
            return False

    # -- a run of ipykernel ----------------------------------------------------------------

    def start(self) -> tuple[subprocess.Popen, int]:
        self.generation += 1
        since = time.time_ns() - 1_000_000_000  # the file system's clock is coarser
        child = subprocess.Popen(
            [sys.executable, "-m", "ipykernel_launcher", "-f", self.connection],
            cwd=self.cwd,
            start_new_session=True,
        )
        self.child = child
        self.write_state(alive=True, bound=False, pid=child.pid)
        return child, since

    def follow(self, child: subprocess.Popen, info: dict, since: int) -> int:
        """Until this run ends: the server's wishes, and ``bound`` once the sockets exist."""
        bound = False
        while child.poll() is None:
            if not bound and self.bound(info, since):
                bound = True
                self.write_state(alive=True, bound=True, pid=child.pid)
                self.serve_once()
            self.obey(child)
            time.sleep(TICK)
        self.child = None
        return child.returncode

    def obey(self, child: subprocess.Popen) -> None:
        wishes = self.control()
        if wishes.get("stop"):
            self.end_child(child)
            return
        if wishes.get("kill") == self.generation:
            child.kill()
        interrupt = wishes.get("interrupt")
        if interrupt is not None and interrupt != self._interrupt:
            self._interrupt = interrupt
            try:
                os.kill(child.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def end_child(self, child: subprocess.Popen) -> None:
        if child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(2)
        except subprocess.TimeoutExpired:
            child.kill()

    # -- the hub ---------------------------------------------------------------------------

    def serve_once(self) -> None:
        """Answer HTTP on the server's port (the hub's readiness), from the first run's
        bound sockets on."""
        if self.http is not None:
            return
        if self.relay:  # Slurm: the port serves the channels' relay too
            from .relay import serve_relay

            self.http = True
            serve_relay(self.where, self.info["ip"], self.answer)
            threading.Thread(target=self.watch_activity, daemon=True).start()
            return
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        runner = self

        class Answer(BaseHTTPRequestHandler):
            def _answer(self):
                body = json.dumps(runner.answer()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(self.where, Answer)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        threading.Thread(target=self.watch_activity, daemon=True).start()

    def answer(self) -> dict:
        """What the server port answers a plain request (the hub's readiness)."""
        return {"kernel": self.kernel.get("id"), "generation": self.generation}

    def watch_activity(self) -> None:
        """Subscribe to the kernel's own iopub and report activity while cells run."""
        import zmq

        info = self.info
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"ipc://{info['ip']}-{info['iopub_port']}")
        reported = 0.0
        ran = False
        while not self.stopping.is_set():
            if sub.poll(1000):
                ran |= self.cell_status(sub.recv_multipart())
            now = time.monotonic()
            if (ran or self.busy_since is not None) and now - reported >= ACTIVITY_INTERVAL:
                report_activity()
                reported, ran = now, False

    def cell_status(self, frames: list[bytes]) -> bool:
        """Read one iopub message: True when a cell (or a widget) finished running."""
        try:
            i = frames.index(b"<IDS|MSG>")
            header, parent = json.loads(frames[i + 2]), json.loads(frames[i + 3])
            if header.get("msg_type") != "status":
                return False
            if parent.get("msg_type") not in ("execute_request", "comm_msg"):
                return False
            state = json.loads(frames[i + 5]).get("execution_state")
        except (ValueError, IndexError):
            return False
        if state == "busy":
            self.busy_since = time.monotonic()
            return True
        if state == "idle":
            self.busy_since = None
            return True
        return False

    # -- the whole life --------------------------------------------------------------------

    def on_term(self, signum, frame) -> None:
        self.stopping.set()
        if self.child is not None:
            self.end_child(self.child)
            self.write_state(alive=False, exit_code=self.child.returncode, bound=False)
        os._exit(0)

    def run(self, where: tuple[str, int]) -> int:
        self.where = where
        signal.signal(signal.SIGTERM, self.on_term)
        try:
            self.lock = self.hold_lock()
        except OSError as e:
            print(
                f"gpuhub-kernel: the connection folder {self.folder} is not usable: {e}",
                file=sys.stderr,
            )
            return 2
        info = read_json(self.path(CONNECTION))
        if info.get("relay"):  # Slurm: the channels in the sandbox, the relay carries them
            from .relay import local_connection

            info, private = local_connection(info)
            self.connection, self.relay = os.path.join(private, CONNECTION), True
        if not info.get("ip"):
            print(f"gpuhub-kernel: no connection file in {self.folder}", file=sys.stderr)
            return 2
        self.info = info
        stopped_at = None
        while True:
            wishes = self.control()
            if wishes.get("stop"):
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > STOP_LINGER:
                    return 0
            elif self.generation == 0 or int(wishes.get("want") or 0) > self.generation:
                self.generation = max(self.generation, int(wishes.get("want") or 1) - 1)
                child, since = self.start()
                code = self.follow(child, info, since)
                self.write_state(alive=False, exit_code=code, bound=False)
                continue
            time.sleep(TICK * 2)


def report_activity() -> None:
    """``POST /hub/api/users/<name>/activity`` for this server: a cell ran now."""
    import urllib.parse
    import urllib.request
    from datetime import UTC, datetime

    api = os.environ.get("JUPYTERHUB_API_URL", "").rstrip("/")
    user = os.environ.get("JUPYTERHUB_USER", "")
    server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    if not (api and user):
        return
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    body = {"last_activity": now, "servers": {server: {"last_activity": now}}}
    request = urllib.request.Request(
        f"{api}/users/{urllib.parse.quote(user, safe='')}/activity",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"token {os.environ.get('JUPYTERHUB_API_TOKEN', '')}",
            "Content-Type": "application/json",
        },
    )
    try:
        urllib.request.urlopen(request, timeout=5).close()  # noqa: S310 - the hub
    except OSError as e:
        print(f"gpuhub-kernel: activity not reported: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        kernel = json.loads(os.environ["GPUHUB_KERNEL"])
    except (KeyError, ValueError):
        print("gpuhub-kernel: GPUHUB_KERNEL is missing: the hub starts this", file=sys.stderr)
        return 2
    root = os.environ.get("GPUHUB_WORKSPACE_MOUNT") or os.path.expanduser("~/work")
    return Runner(kernel, root).run(address(argv))


if __name__ == "__main__":
    sys.exit(main())
