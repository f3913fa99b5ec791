"""The network of a Slurm job's sandbox: a namespace of its own, whose only ways in and out
are the server's HTTP port and the hub's API, and its log kept to a size.

This file runs on the compute nodes, not in the hub: standard library only, Python 3.9 or
newer.  The batch script (:func:`hub_ext.slurm.network.network_script`) runs it twice:

``python3 sandbox_net.py node --dir D [--outbound none|slirp4netns|pasta]
[--log-max-bytes N] -- bwrap ... --unshare-net ... -- COMMAND``
    on the node, as the member, outside the sandbox.  ``D`` is a folder of the member's
    (mode 0700, made by the batch script) that bubblewrap binds into the sandbox at
    :data:`INSIDE_DIR`.  It listens on a free TCP port of the node (written to ``D/port``:
    the server's port, which the hub and the proxy reach) and forwards each connection to
    ``D/server.sock``; it listens on ``D/hub.sock`` and forwards each connection to the hub's
    API (``$JUPYTERHUB_API_URL``'s host and port).  It starts the sandbox, gives it outbound
    traffic through slirp4netns or pasta when the site allows it (``--outbound``), passes
    the sandbox's output on to the job's log, keeping at most ``--log-max-bytes`` in it (a
    fuller log is moved to ``<log>.1`` and a new one begun), forwards the signals Slurm
    sends, and exits with the sandbox's exit code.

``python3 /tmp/gpuhub-net.py inside -- COMMAND`` (the batch script binds this file there)
    in the sandbox, in place of batchspawner's wrapper.  It listens on ``D/server.sock`` and
    forwards each connection to the server's port on the sandbox's own loopback, and on a
    free loopback port for the hub's API, forwarded to ``D/hub.sock``; it points
    ``JUPYTERHUB_API_URL`` (and ``JUPYTERHUB_ACTIVITY_URL``) at that port and
    ``JUPYTERHUB_SERVICE_URL`` at ``127.0.0.1`` and the node's port, reports the port to the
    hub (``POST <api>/batchspawner {"port": P}``, as batchspawner's wrapper does), then
    becomes ``COMMAND`` (JupyterLab, or a notebook job's runner).

Nobody else reaches the sandbox's loopback (a kernel's ports, a TensorBoard, a Flask app),
and the sandbox reaches nothing but what is forwarded (and, with ``--outbound``, the
outside world through a user-mode network stack that cannot reach the node's loopback).
docs/howto/slurm.md ("The job's network") says what a site needs.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

#: Where the sandbox sees the node's folder ``D``.
INSIDE_DIR = "/tmp/gpuhub-net"
#: Where the sandbox sees this file.
INSIDE_SCRIPT = "/tmp/gpuhub-net.py"
#: The most connections one forwarder carries at once; more wait for a free one.
MAX_CONNECTIONS = 512
CHUNK = 65536


# -- forwarding ---------------------------------------------------------------------------


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


class Forwarder:
    """Carries each connection a listener takes to a new connection made by ``connect``
    (an async function returning a reader and a writer), bytes unchanged both ways."""

    def __init__(self, connect):
        self.connect = connect
        self.slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        async with self.slots:
            try:
                far_reader, far_writer = await self.connect()
            except OSError:
                writer.close()
                return
            try:
                await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))
            finally:
                for w in (writer, far_writer):
                    w.close()


def tcp_to(host: str, port: int):
    return lambda: asyncio.open_connection(host, port)


def unix_to(path: str):
    return lambda: asyncio.open_unix_connection(path)


def hub_address(api_url: str) -> tuple[str, int]:
    """The host and port of the hub's API URL."""
    url = urllib.parse.urlsplit(api_url)
    if not url.hostname:
        raise ValueError(f"JUPYTERHUB_API_URL has no host: {api_url!r}")
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def with_netloc(url: str, host: str, port: int) -> str:
    """``url`` with its host and port replaced."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{port}"))


# -- the job's log --------------------------------------------------------------------------


class RotatingLog:
    """The job's log (this process's stdout, Slurm's ``--output`` file): at most ``max_bytes``
    in it; past that it is renamed ``<log>.1`` (the previous one replaced) and a new one is
    begun, so the log and its predecessor hold the latest output.  Where stdout is no
    regular file, what passes ``max_bytes`` is dropped."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.fd = sys.stdout.fileno()
        self.written = 0
        try:
            self.path = os.readlink(f"/proc/self/fd/{self.fd}")
            if not os.path.isfile(self.path):
                self.path = ""
            else:
                self.written = os.fstat(self.fd).st_size
        except OSError:
            self.path = ""

    def write(self, data: bytes) -> None:
        if self.max_bytes and self.written + len(data) > self.max_bytes:
            if not self.path:
                data = data[: max(0, self.max_bytes - self.written)]
            else:
                self._rotate()
        if data:
            os.write(self.fd, data)
            self.written += len(data)

    def _rotate(self) -> None:
        old = self.path + ".1"
        try:
            os.replace(self.path, old)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        except OSError:
            self.path = ""  # cannot rotate: keep to the bound by dropping
            return
        os.dup2(fd, self.fd)
        os.close(fd)
        note = f"gpuhub: the log went past its size; earlier output in {old}\n".encode()
        os.write(self.fd, note)
        self.written = len(note)


async def _copy_output(stream: asyncio.StreamReader, log: RotatingLog) -> None:
    while True:
        data = await stream.read(CHUNK)
        if not data:
            return
        log.write(data)


# -- on the node ----------------------------------------------------------------------------


#: ioctl(2) on a namespace's file: a new descriptor of the user namespace that owns it
NS_GET_USERNS = 0xB701


def owning_userns(pid: int) -> int:
    """A descriptor of the user namespace that owns process ``pid``'s network namespace.
    Not ``/proc/<pid>/ns/user``: bubblewrap's ``--disable-userns`` moves the sandbox into
    a nested user namespace, without the rights over the network namespace that the
    network stack must join (``setns(CLONE_NEWNET): Operation not permitted``, when it
    reads the nested one)."""
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        return fcntl.ioctl(net, NS_GET_USERNS)
    finally:
        os.close(net)


def outbound_command(kind: str, pid: int, userns: str | None = None) -> list[str]:
    """The user-mode network stack that gives the sandbox (a process ``pid`` in it) its
    outbound traffic, never the node's loopback, and no port of the sandbox to the node;
    ``userns``: the path of the user namespace owning its network namespace (default
    ``/proc/<pid>/ns/user``)."""
    userns = userns or f"/proc/{pid}/ns/user"
    if kind == "slirp4netns":
        return [
            "slirp4netns",
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            f"--userns-path={userns}",
            str(pid),
            "tap0",
        ]
    if kind == "pasta":
        return [
            "pasta",
            "--config-net",
            "--quiet",
            "--foreground",
            "--no-map-gw",  # the node is not reached through the gateway's address
            "-t",
            "none",
            "-u",
            "none",
            "-T",
            "none",
            "-U",
            "none",
            "--userns",
            userns,
            "--netns",
            f"/proc/{pid}/ns/net",
        ]
    raise ValueError(f"unknown outbound network: {kind!r}")


async def run_node(folder: str, outbound: str, log_max_bytes: int, command: list[str]) -> int:
    """The node's side (module doc); returns the sandbox's exit code."""
    loop = asyncio.get_running_loop()
    hub = hub_address(os.environ.get("JUPYTERHUB_API_URL", ""))
    server = await asyncio.start_server(
        Forwarder(unix_to(os.path.join(folder, "server.sock"))), "0.0.0.0", 0
    )
    port = server.sockets[0].getsockname()[1]
    with open(os.path.join(folder, "port.new"), "w") as f:
        f.write(str(port))
    os.replace(os.path.join(folder, "port.new"), os.path.join(folder, "port"))
    hub_socket = await asyncio.start_unix_server(
        Forwarder(tcp_to(*hub)), os.path.join(folder, "hub.sock")
    )
    info_r = info_w = None
    if outbound != "none":
        info_r, info_w = os.pipe()
        os.set_inheritable(info_w, True)
        command = [command[0], "--info-fd", str(info_w), *command[1:]]
    # the sandbox keeps the descriptors the batch script gave this process (bubblewrap's
    # --ro-bind-data reads its files from them); the runner's own are not inheritable
    child = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        close_fds=False,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        loop.add_signal_handler(sig, _forward_signal, child, sig)
    log = RotatingLog(log_max_bytes)
    copying = asyncio.ensure_future(_copy_output(child.stdout, log))
    stack = None
    if info_w is not None:
        os.close(info_w)
        stack = await _start_outbound(outbound, info_r, log)
    code = await child.wait()
    await copying
    for s in (server, hub_socket):
        s.close()
    if stack is not None and stack.returncode is None:
        stack.terminate()
        await stack.wait()
    shutil.rmtree(folder, ignore_errors=True)
    return code if code >= 0 else 128 - code  # killed by a signal: as a shell says it


def _forward_signal(child, sig) -> None:
    if child.returncode is None:
        child.send_signal(sig)


async def _start_outbound(kind: str, info_fd: int, log: RotatingLog):
    """Read the sandbox's pid from bubblewrap's ``--info-fd``, then start the network
    stack for it; None when it cannot start (the sandbox runs without outbound traffic,
    and the log says why)."""
    loop = asyncio.get_running_loop()
    with os.fdopen(info_fd, "rb") as f:
        text = await loop.run_in_executor(None, f.read)
    try:
        pid = int(json.loads(text)["child-pid"])
    except (ValueError, KeyError, TypeError):
        log.write(b"gpuhub: no outbound network: the sandbox did not say its pid\n")
        return None
    try:
        userns = owning_userns(pid)
    except OSError as e:
        log.write(f"gpuhub: no outbound network: the sandbox's namespaces: {e}\n".encode())
        return None
    try:
        stack = await asyncio.create_subprocess_exec(
            *outbound_command(kind, pid, f"/proc/self/fd/{userns}"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(userns,),
        )
    except OSError as e:
        log.write(f"gpuhub: no outbound network: {kind} did not start: {e}\n".encode())
        return None
    finally:
        os.close(userns)

    async def report():
        err = await stack.stderr.read(4096)
        code = await stack.wait()
        if code:
            words = err.decode(errors="replace").strip()[-500:]
            log.write(f"gpuhub: {kind} exited ({code}): {words}\n".encode())

    asyncio.ensure_future(report())
    return stack


# -- inside the sandbox ---------------------------------------------------------------------


def _serve_inside(folder: str, port: int, hub_listener: socket.socket) -> None:
    """The forked child inside the sandbox: both forwarders, for the sandbox's life."""

    async def main():
        await asyncio.start_unix_server(
            Forwarder(tcp_to("127.0.0.1", port)), os.path.join(folder, "server.sock")
        )
        await asyncio.start_server(
            Forwarder(unix_to(os.path.join(folder, "hub.sock"))), sock=hub_listener
        )
        await asyncio.Event().wait()

    asyncio.run(main())


def report_port(api_url: str, token: str, port: int, attempts: int = 30) -> None:
    """``POST <api>/batchspawner {"port": port}`` with the server's token, as batchspawner's
    wrapper does; tried again while the hub does not answer (raising the last error).  A
    refusal is said on stderr and the server starts all the same, as batchspawner's wrapper
    does (the hub's start then waits for a port it never gets, and ends it)."""
    request = urllib.request.Request(
        api_url.rstrip("/") + "/batchspawner",
        data=json.dumps({"port": port}).encode(),
        method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=30):
                return
        except urllib.error.HTTPError as e:
            print(f"gpuhub: the hub refused the port report: {e.code} {e.reason}", file=sys.stderr)
            return
        except OSError:
            if attempt == attempts - 1:
                raise
            time.sleep(1)


def run_inside(folder: str, command: list[str]) -> None:
    """The sandbox's side (module doc); becomes ``command``, never returns."""
    with open(os.path.join(folder, "port")) as f:
        port = int(f.read().strip())
    hub_listener = socket.socket()
    hub_listener.bind(("127.0.0.1", 0))
    hub_listener.listen(128)
    hub_port = hub_listener.getsockname()[1]
    if os.fork() == 0:
        try:
            os.setsid()
            _serve_inside(folder, port, hub_listener)
        finally:
            os._exit(0)
    hub_listener.close()
    api = os.environ.get("JUPYTERHUB_API_URL", "")
    origin = urllib.parse.urlunsplit(urllib.parse.urlsplit(api)._replace(path="", query=""))
    for name in ("JUPYTERHUB_API_URL", "JUPYTERHUB_ACTIVITY_URL"):
        value = os.environ.get(name, "")
        if value.startswith(origin):
            os.environ[name] = with_netloc(value, "127.0.0.1", hub_port)
    service = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    if service:
        os.environ["JUPYTERHUB_SERVICE_URL"] = with_netloc(service, "127.0.0.1", port)
    else:
        command = [*command, f"--port={port}"]
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    report_port(os.environ["JUPYTERHUB_API_URL"], token, port)
    os.execvp(command[0], command)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("sandbox_net.py: a command to run is needed after --", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="sandbox_net.py", description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=("node", "inside"))
    parser.add_argument("--dir", default=INSIDE_DIR)
    parser.add_argument("--outbound", choices=("none", "slirp4netns", "pasta"), default="none")
    parser.add_argument("--log-max-bytes", type=int, default=0)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("a command to run is needed after --")
    if args.side == "inside":
        run_inside(args.dir, command)
        return 1
    return asyncio.run(run_node(args.dir, args.outbound, args.log_max_bytes, command))


if __name__ == "__main__":
    sys.exit(main())
