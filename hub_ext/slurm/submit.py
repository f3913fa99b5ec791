"""Where the hub runs its Slurm commands: on its own host, or on a submit host over OpenSSH.

Every command the Slurm backend runs (batchspawner's ``sbatch``/``squeue``/``scancel``,
the spawn page's and the board's ``sinfo``/``squeue``/``scontrol``, the token file written
as the member) goes through :meth:`SubmitHost.run`, so there is one place that decides
where it runs:

- ``host`` empty: on the hub's host, with ``env`` added to the hub's environment;
- ``host`` set (``login1``, ``gpuhub@login1``): ``ssh <options> HOST -- <command line>``.
  ssh joins its arguments into one line for the remote login shell (OpenSSH ssh(1):
  "command is executed on the remote host instead of a login shell"), so the command line
  is built with :func:`shlex.join`: every word (a member's name, a job name, a value of a
  profile) reaches the remote command as one argument and is never read as shell.  ssh
  does not forward the environment (``SendEnv`` needs the server's ``AcceptEnv``), so
  ``env`` travels on the remote side as ``env NAME=value ...`` before the command.

A submit host that does not answer makes ssh exit with status 255 (ssh(1): "ssh exits
with the exit status of the remote command or with 255 if an error occurred");
:class:`SubmitHostUnavailable` then names the host.  The remote commands never exit 255
themselves (Slurm's commands, runuser and sudo exit 1, 126 or 127 on failure).

The default ssh options keep one connection open and reuse it (OpenSSH
``ControlMaster=auto``, ``ControlPersist``: ssh_config(5)), so a command costs a new
session on an open connection, not a new key exchange; ``BatchMode=yes`` makes ssh fail
instead of asking for a password, ``ConnectTimeout`` bounds the wait for a host that
does not answer.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_SSH",
    "NOT_SENT",
    "SUBMIT_HOST_DOWN",
    "CommandFailed",
    "SubmitHost",
    "SubmitHostUnavailable",
    "check_host",
    "run_batch_command",
]

#: The ssh command line before the host (``c.GPUSlurmSpawner.submit_ssh_command``):
#: batch mode, a bounded connect, and one shared connection per host kept 5 min after
#: its last command (the control socket in the hub user's ``~/.ssh``, made 0700 by
#: :meth:`SubmitHost.run` when missing).
DEFAULT_SSH = (
    "ssh",
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=5",
    "-o",
    "ServerAliveInterval=15",
    "-o",
    "ServerAliveCountMax=2",
    "-o",
    "ControlMaster=auto",
    "-o",
    "ControlPersist=300",
    "-o",
    "ControlPath=~/.ssh/gpuhub-%C",
)

#: ssh's own exit status for its errors (no connection, no authentication)
SSH_FAILED = 255

#: batchspawner's status query reads this error as "unknown" (``state_isunknown``): a
#: submit host that does not answer stops no server
SUBMIT_HOST_DOWN = "gpuhub: submit host unreachable"

#: The job environment's variables that stay on the hub's host.  The API token: the job
#: reads it from its token file, never from a command line on the submit host.  The hub's
#: own paths (JupyterHub's ``env_keep``): on the submit host, the commands and the job take
#: that host's (``slurm_env`` may still set any of them).
NOT_SENT = (
    "JUPYTERHUB_API_TOKEN",
    "JPY_API_TOKEN",
    "PATH",
    "PYTHONPATH",
    "CONDA_ROOT",
    "CONDA_DEFAULT_ENV",
    "VIRTUAL_ENV",
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: user@host or host, where neither part starts with "-" (not an ssh option) nor holds
#: white space or shell characters
_HOST = re.compile(r"(?:[A-Za-z0-9._][A-Za-z0-9._-]*@)?[A-Za-z0-9._\[][A-Za-z0-9._:\[\]-]*")


def check_host(host: str) -> str:
    """``host`` if it is empty or a plain ``[user@]host``; raises ValueError naming the
    setting otherwise (an ssh option or a shell word is never taken for a host)."""
    if host and not _HOST.fullmatch(host):
        raise ValueError(
            f"GPUHUB_SLURM_SUBMIT_HOST / c.GPUSlurmSpawner.submit_host = {host!r} "
            "is not a host: use 'login1' or 'gpuhub@login1'"
        )
    return host


class CommandFailed(RuntimeError):
    """The command ran and exited non-zero; ``stderr`` is its error output (stripped)."""

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        super().__init__(stderr)
        self.argv, self.returncode, self.stderr = argv, returncode, stderr


class SubmitHostUnavailable(RuntimeError):
    """ssh could not run the command on the submit host (exit 255, or no answer within
    the time-out); the message names the host and ssh's reason."""


@dataclass(frozen=True)
class SubmitHost:
    """Runs commands here (``host`` empty) or on ``host`` over ``ssh`` (an argv before
    the host, :data:`DEFAULT_SSH` and the site's options)."""

    host: str = ""
    ssh: tuple[str, ...] = field(default=DEFAULT_SSH)

    def __post_init__(self):
        check_host(self.host)

    @property
    def remote(self) -> bool:
        return bool(self.host)

    def command(
        self, argv: list[str], env: dict[str, str] | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """``(argv to execute here, its environment)`` for running ``argv`` with ``env``
        added to its environment, here or on the submit host.  Raises ValueError for an
        environment name that is not one (it would become a command on the remote
        side)."""
        env = dict(env or {})
        for name in env:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"not an environment variable name: {name!r}")
        if not self.remote:
            return list(argv), {**os.environ, **env}
        words = (["env", *(f"{k}={v}" for k, v in env.items())] if env else []) + list(argv)
        return [*self.ssh, self.host, "--", shlex.join(words)], dict(os.environ)

    async def run(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        input: bytes | None = None,
        timeout: float | None = None,
    ) -> str:
        """Run ``argv`` (off the event loop: a subprocess) and return its stdout.

        Raises :class:`SubmitHostUnavailable` when ssh cannot reach the submit host or
        nothing answers within ``timeout`` seconds on a remote host,
        :class:`CommandFailed` when the command exits non-zero, TimeoutError when a
        local command takes over ``timeout`` seconds, OSError when it cannot start."""
        cmd, full_env = self.command(argv, env)
        if self.remote:
            # the default ControlPath's folder (ssh makes ~/.ssh only for known_hosts)
            os.makedirs(os.path.expanduser("~/.ssh"), mode=0o700, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE if input is not None else None,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            cwd="/",
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), timeout)
        except TimeoutError:
            # the whole process group; then our ends of the pipes, which asyncio waits
            # on too: an ssh multiplexing client hands its stdio to the shared connection's
            # master, which keeps them while the host does not answer
            os.killpg(proc.pid, signal.SIGKILL)
            proc._transport.close()  # asyncio.subprocess.Process has no public close
            await proc.wait()
            if self.remote:
                raise SubmitHostUnavailable(
                    f"the submit host {self.host} did not answer {argv[0]} within {timeout} s"
                ) from None
            raise
        stderr = err.decode(errors="replace").strip()
        if self.remote and proc.returncode == SSH_FAILED:
            raise SubmitHostUnavailable(f"the submit host {self.host} did not answer: {stderr}")
        if proc.returncode != 0:
            raise CommandFailed(list(argv), proc.returncode, stderr)
        return out.decode(errors="replace")


async def run_batch_command(
    submit: SubmitHost,
    cmd: str,
    input: str | None = None,
    env: dict | None = None,
    slurm_env: dict | None = None,
    timeout: float | None = None,
    log=None,
    who: str = "",
) -> str:
    """batchspawner's Slurm commands (``exec_prefix`` + ``sbatch``/``squeue``/``scancel``,
    a shell line whose words batchspawner formats, the member's name quoted), run through
    ``submit`` with ``env`` (less :data:`NOT_SENT` on a submit host) and ``slurm_env``;
    ``timeout`` only on a submit host.  Returns stdout, stripped.  Raises RuntimeError
    with the command's error output (batchspawner reads it), or with
    :data:`SUBMIT_HOST_DOWN` when the submit host does not answer."""
    env = dict(env or {})
    if submit.remote:
        for name in NOT_SENT:
            env.pop(name, None)
    env.update(slurm_env or {})
    try:
        out = await submit.run(
            shlex.split(cmd),
            env=env,
            input=input.encode() if input else None,
            timeout=timeout if submit.remote else None,
        )
    except SubmitHostUnavailable as e:
        if log is not None:
            log.error("%s: %s", who, e)
        raise RuntimeError(f"{SUBMIT_HOST_DOWN}: {e}") from None
    except CommandFailed as e:
        if log is not None:
            log.error("%s: %s exited %d: %s", who, cmd, e.returncode, e.stderr)
        raise RuntimeError(e.stderr) from None
    return out.strip()
