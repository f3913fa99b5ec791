"""How a member's server reaches a GPU kernel: one small strategy object per way.

:class:`Transport` is what :class:`gpuhub_kernels.provisioner.GPUHubProvisioner` asks of a
way to reach the kernel: make the kernel manager's connection (its ZMQ channels), say
whether the kernel's side lives and which run of ipykernel it is on, and pass it the
server's wishes (run ipykernel again, interrupt, kill, stop).

:class:`WorkspaceIPC` is the Docker way (docs: explanation/gpu-kernels, "Why ipc"): the
kernel's container and the member's server both mount her workspace at the same path, and
a folder of hers in it, ``.gpuhub/kernels/<id>/`` (0700, her uid), holds

- ``connection.json`` (0600): the channels, ZMQ over ``ipc`` sockets in that folder
  (``k-1`` ... ``k-5``), and the key; written by the server;
- ``control.json``: the server's wishes, ``{"want": <run>, "kill": <run>,
  "interrupt": <n>, "stop": bool}``; written by the server, read by ``gpuhub-kernel``;
- ``state.json``: ``{"generation": <run>, "alive": bool, "exit_code", "bound": bool}``;
  written by ``gpuhub-kernel``, read by the server;
- ``lock``: held (``flock``) by ``gpuhub-kernel`` for as long as it lives, so the server
  knows at once when the kernel's container is gone (killed, out of memory), without
  waiting for the hub.

Only the member's uid can enter the folder, and only containers with her workspace
mounted can see it: no other member's process on the host connects, subscribes or sends.
A kernel on another machine (Slurm) is reached by :class:`gpuhub_kernels.relay.WorkspaceRelay`
instead; :func:`transport_for` picks the strategy the hub asked for.

This module imports nothing from Jupyter (``gpuhub-kernel`` imports it at its start).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil

__all__ = [
    "CONNECTION",
    "CONTROL",
    "LOCK",
    "PORTS",
    "STATE",
    "Transport",
    "WorkspaceIPC",
    "transport_for",
]

CONNECTION = "connection.json"
CONTROL = "control.json"
STATE = "state.json"
LOCK = "lock"
#: the ipc socket files' prefix in the folder, and their "ports" (the socket files are
#: ``<prefix>-<port>``): one folder per kernel, so fixed numbers
SOCKETS = "k"
PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}


def write_json(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` at once (a new file renamed over it), mode 0600."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict:
    """The JSON object in ``path``; ``{}`` when it is missing or not (yet) whole."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Transport:
    """A way to reach a GPU kernel's channels (see the module doc).  Every method is
    required (NotImplementedError here)."""

    def prepare(self, km) -> None:
        """Set the kernel manager's connection (transport, ip, ports) and write what the
        kernel's side reads; the key is ``km.session.key``."""
        raise NotImplementedError

    def started(self) -> bool:
        """Whether the kernel's side has started (its container runs, or ran)."""
        raise NotImplementedError

    def alive(self) -> bool:
        """Whether the kernel's side still lives (False before it started)."""
        raise NotImplementedError

    def state(self) -> dict:
        """The kernel side's last word: ``generation``, ``alive``, ``exit_code``,
        ``bound``."""
        raise NotImplementedError

    def control(self, **wishes) -> None:
        """Pass the server's wishes (``want``, ``kill``, ``interrupt``, ``stop``)."""
        raise NotImplementedError

    def start(self, hub, kernel_id: str) -> None:
        """The hub has the kernel (its id ``kernel_id``; ``hub``: :class:`~.hub.HubKernels`),
        or it was restarted: carry the channels where a strategy has to (the relay), on
        socket files jupyter_client may have removed meanwhile."""

    def cleanup(self) -> None:
        """Remove what :meth:`prepare` made (the kernel ended)."""
        raise NotImplementedError


class WorkspaceIPC(Transport):
    """ipc sockets and files in ``folder``, a folder of the member's workspace mounted in
    the kernel's container at the same path (Docker)."""

    def __init__(self, folder: str):
        self.folder = folder

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def make_folder(self) -> None:
        """Make the folder (and ``.gpuhub/kernels``) the member's alone: 0700."""
        os.makedirs(os.path.dirname(self.folder), mode=0o700, exist_ok=True)
        os.mkdir(self.folder, 0o700)
        os.chmod(self.folder, 0o700)  # whatever the umask

    def prepare(self, km) -> None:
        km.transport = "ipc"
        km.ip = self.path(SOCKETS)
        for name, port in PORTS.items():
            setattr(km, name, port)
        info = dict(km.get_connection_info())
        key = info.get("key", b"")
        info["key"] = key.decode() if isinstance(key, bytes) else key
        info["kernel_name"] = getattr(km, "kernel_name", "")
        write_json(self.path(CONNECTION), info)

    def started(self) -> bool:
        return os.path.exists(self.path(LOCK))

    def alive(self) -> bool:
        try:
            fd = os.open(self.path(LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)  # gpuhub-kernel holds it
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def state(self) -> dict:
        return read_json(self.path(STATE))

    def control(self, **wishes) -> None:
        write_json(self.path(CONTROL), {**read_json(self.path(CONTROL)), **wishes})

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


#: the strategy the hub asks a member's server for (``$GPUHUB_KERNEL_TRANSPORT``, set by
#: the hub's backend): "ipc" (Docker, the default) or "relay" (Slurm)
TRANSPORT_ENV = "GPUHUB_KERNEL_TRANSPORT"


def transport_for(folder: str, runtime: str | None = None) -> Transport:
    """The strategy of this server's GPU kernels for the kernel folder ``folder``:
    :class:`WorkspaceIPC`, or :class:`gpuhub_kernels.relay.WorkspaceRelay` where the hub's
    backend runs kernels on other machines (``$GPUHUB_KERNEL_TRANSPORT=relay``)."""
    if os.environ.get(TRANSPORT_ENV, "ipc") == "relay":
        from .relay import WorkspaceRelay

        return WorkspaceRelay(folder, runtime)
    return WorkspaceIPC(folder)
