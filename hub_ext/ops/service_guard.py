"""Managed services never outlive their hub.

JupyterHub starts each ``c.JupyterHub.services`` entry that has a ``command`` through a
``LocalProcessSpawner`` (``jupyterhub.services.service._ServiceSpawner``) in a session of
its own, so a hub killed with SIGKILL leaves them running: the next hub's service then
cannot bind its port ("Address already in use") while the hub talks to the orphan.

:func:`guard_services` rewrites each such command to run through this module first::

    python -m hub_ext.ops.service_guard --hub-pid 1234 \
        --pid-file STATE/services/credits.pid -- CMD...

which, in the service's own process and before ``exec`` of ``CMD``:

0. gives SIGINT and SIGTERM (and SIGPIPE, SIGXFSZ) their default action back
   (:func:`default_stop_signals`): a hub started in the background by a script
   (``scripts/demo.sh &``) has SIGINT ignored (POSIX: a shell without job control
   ignores it for ``&`` commands), every child inherits that, and a Python service then
   never sees the SIGINT with which JupyterHub stops it (``LocalProcessSpawner.stop``:
   SIGINT, then SIGTERM only after ``interrupt_timeout``, 30 s in JupyterHub 6.1, which
   no ``c.JupyterHub.services`` entry can set).  jupyterhub-idle-culler kept each SIGTERM
   shutdown of the demo waiting that long;
1. asks Linux to send it SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``,
   prctl(2); the setting survives ``execve`` and the parent is the hub's event-loop
   thread, which lives as long as the hub);
2. exits at once (status 1) when the hub died before step 1 (its parent is no longer
   ``--hub-pid``);
3. stops stale copies of the same service left by an earlier hub: the pid in
   ``--pid-file`` and any other process of this user that runs exactly ``CMD``
   (``/proc/PID/cmdline``; ``CMD`` names the hub's state dir); SIGTERM, then SIGKILL
   after :data:`STALE_GRACE` seconds;
4. writes its own pid into ``--pid-file`` (mode 0600) and ``exec``\\ s ``CMD``.

Linux only (prctl); elsewhere step 1 is skipped and steps 3-4 still stop stale copies.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: Seconds a stale service gets to exit after SIGTERM before SIGKILL.
STALE_GRACE = 5.0
PID_DIR = "services"


def guarded(command: list[str], name: str, state_dir: Path, hub_pid: int) -> list[str]:
    """``command`` run through this module (see the module docstring)."""
    pid_file = Path(state_dir) / PID_DIR / f"{name}.pid"
    return [
        sys.executable,
        "-m",
        __name__,
        "--hub-pid",
        str(hub_pid),
        "--pid-file",
        str(pid_file),
        "--",
        *command,
    ]


def guard_services(c, state_dir: Path, hub_pid: int | None = None) -> None:
    """Run every managed service of ``c.JupyterHub.services`` (one with a ``command``)
    through :func:`guarded`; ``hub_pid`` defaults to this process, the hub that loads the
    configuration.  Already guarded commands are left as they are."""
    if "services" not in c.JupyterHub:
        return
    hub_pid = os.getpid() if hub_pid is None else hub_pid
    services = []
    for service in c.JupyterHub.services:
        command = service.get("command")
        if command and command[1:3] != ["-m", __name__]:
            service = {
                **service,
                "command": guarded(list(command), service["name"], state_dir, hub_pid),
            }
        services.append(service)
    c.JupyterHub.services = services


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``; False where there is no prctl (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True


#: Signals whose action a service gets back as the default: JupyterHub's two stop signals,
#: and the two that ``subprocess.Popen(restore_signals=True)`` resets for a child and this
#: module's own Python interpreter ignores again.
DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ)


def default_stop_signals() -> None:
    """Set :data:`DEFAULT_SIGNALS` to ``SIG_DFL``; the setting survives ``execve``
    (signal(7)), so the service starts as if JupyterHub had started it from a shell
    that ignores nothing (a Python service then turns SIGINT into KeyboardInterrupt)."""
    for sig in DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [os.fsdecode(part) for part in raw.split(b"\0")[:-1]]


def _owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def stale_copies(pid_file: Path, command: list[str]) -> set[int]:
    """Processes of this user, other than this one, that run exactly ``command``: the pid
    in ``pid_file``, and any other (a copy left by a hub from before this guard, which
    wrote no pid file).  The command names the hub's state dir (a database, a config
    file), so it is this hub's service and no other's."""
    candidates = {int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    try:
        candidates.add(int(pid_file.read_text().strip()))
    except (OSError, ValueError):
        pass
    return {
        pid
        for pid in candidates
        if pid != os.getpid() and _owned_by_me(pid) and _cmdline(pid) == command
    }


def stop_stale(pid_file: Path, command: list[str]) -> set[int]:
    """Stop every :func:`stale_copies` process (SIGTERM, SIGKILL after
    :data:`STALE_GRACE` seconds); returns their pids."""
    stale = stale_copies(pid_file, command)
    for pid in stale:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STALE_GRACE
    while any(_cmdline(pid) == command for pid in stale) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in stale:
        if _cmdline(pid) == command:
            os.kill(pid, signal.SIGKILL)
    return stale


def write_pid(pid_file: Path) -> None:
    pid_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hub_ext.ops.service_guard",
        description="Run a hub-managed service that dies with its hub.",
    )
    parser.add_argument("--hub-pid", type=int, required=True)
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    default_stop_signals()
    set_parent_death_signal()
    if os.getppid() != args.hub_pid:
        print(
            f"service_guard: the hub (pid {args.hub_pid}) is gone; not starting {command[0]}",
            file=sys.stderr,
        )
        sys.exit(1)
    for pid in sorted(stop_stale(args.pid_file, command)):
        print(
            f"service_guard: stopped pid {pid}, a copy of {command[0]} left by an earlier hub",
            file=sys.stderr,
        )
    write_pid(args.pid_file)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
