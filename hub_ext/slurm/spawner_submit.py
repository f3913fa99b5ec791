"""The Slurm backend's spawner, its part of the submit host: a part of the spawner.

:class:`SubmitHostSpawner` is mixed into :class:`hub_ext.slurm.spawner.GPUSlurmSpawner`, as
:class:`hub_ext.slurm.spawner_line.SlurmLineSpawner` is.  Its settings say where the Slurm
commands run (``submit_host``, ``submit_ssh_command``; :mod:`.submit` runs them), and it
runs batchspawner's commands there (:meth:`SubmitHostSpawner.run_command`, batchspawner's
hook for every ``sbatch``/``squeue``/``scancel``); the spawner's cluster object
(:class:`hub_ext.slurm.cluster.SlurmCluster`) runs the others through the same
:class:`hub_ext.slurm.submit.SubmitHost`.
"""

from __future__ import annotations

import shlex

from traitlets import Float, List, Unicode, validate
from traitlets.config import LoggingConfigurable

from .submit import DEFAULT_SSH, CommandFailed, SubmitHost, SubmitHostUnavailable, check_host

__all__ = ["NOT_SENT", "SUBMIT_HOST_DOWN", "SubmitHostSpawner"]

#: batchspawner's status query reads this error as "unknown" (``state_isunknown``): a
#: submit host that does not answer stops no server
SUBMIT_HOST_DOWN = "gpuhub: submit host unreachable"

#: The job environment's variables that stay on the hub's host.  The API token: the job
#: reads it from its token file (``hand_token``), never from a command line on the submit
#: host.  The hub's own paths (JupyterHub's ``env_keep``): on the submit host, the commands
#: and the job take that host's (``slurm_env`` may still set any of them).
NOT_SENT = (
    "JUPYTERHUB_API_TOKEN",
    "JPY_API_TOKEN",
    "PATH",
    "PYTHONPATH",
    "CONDA_ROOT",
    "CONDA_DEFAULT_ENV",
    "VIRTUAL_ENV",
)


class SubmitHostSpawner(LoggingConfigurable):
    """Where the Slurm commands run, and batchspawner's commands run there."""

    submit_host = Unicode(
        "",
        config=True,
        help="""The host where the hub runs every Slurm command (sbatch, squeue, scancel,
        sinfo, scontrol) and writes the job's token file as the member, over OpenSSH
        (``submit_ssh_command``): ``login1`` or ``gpuhub@login1``.  Empty: on the hub's
        own host.  The member switch there is ``exec_prefix``.  docs/howto/slurm.md ("A
        submit host") says what the submit host needs.

            c.GPUSlurmSpawner.submit_host = "gpuhub@login1"
        """,
    )

    submit_ssh_command = List(
        list(DEFAULT_SSH),
        config=True,
        help="""The ssh command line before the submit host: add the site's options
        (identity file, port, known hosts).  The default keeps one shared connection per
        host (OpenSSH ControlMaster/ControlPersist, control socket in the hub user's
        ``~/.ssh``), fails instead of asking for a password (BatchMode) and gives up on a
        host that does not answer after 5 s (ConnectTimeout).

            from hub_ext.slurm.submit import DEFAULT_SSH
            c.GPUSlurmSpawner.submit_ssh_command = [
                *DEFAULT_SSH, "-i", "/srv/gpuhub/ssh/id_ed25519", "-p", "2222",
                "-o", "UserKnownHostsFile=/srv/gpuhub/ssh/known_hosts"]
        """,
    )

    submit_timeout = Float(
        60.0,
        config=True,
        help="""Seconds batchspawner's commands (sbatch, squeue, scancel) may take on the
        submit host before it counts as not answering (a job's state is then "unknown":
        its server keeps running).  Only with ``submit_host``.

            c.GPUSlurmSpawner.submit_timeout = 60
        """,
    )

    @validate("submit_host")
    def _check_submit_host(self, proposal):
        return check_host(proposal.value)

    @property
    def submit(self) -> SubmitHost:
        """Where the Slurm commands run (:mod:`.submit`)."""
        return SubmitHost(self.submit_host, tuple(self.submit_ssh_command))

    async def run_command(self, cmd, input=None, env=None):
        """batchspawner's Slurm commands (``exec_prefix`` + ``sbatch``/``squeue``/
        ``scancel``, a shell line whose words batchspawner formats; ``username`` is quoted
        in :meth:`get_req_subvars`), run here or on the submit host (:mod:`.submit`) with
        ``env`` and ``slurm_env``; returns stdout, stripped.  Raises RuntimeError with the
        command's error output (batchspawner reads it), or with :data:`SUBMIT_HOST_DOWN`
        when the submit host does not answer (:meth:`state_isunknown`)."""
        env = dict(env or {})
        if self.submit.remote:
            for name in NOT_SENT:
                env.pop(name, None)
        env.update(self.slurm_env)
        try:
            out = await self.submit.run(
                shlex.split(cmd),
                env=env,
                input=input.encode() if input else None,
                timeout=self.submit_timeout if self.submit.remote else None,
            )
        except SubmitHostUnavailable as e:
            self.log.error("%s: %s", self._log_name, e)
            raise RuntimeError(f"{SUBMIT_HOST_DOWN}: {e}") from None
        except CommandFailed as e:
            self.log.error("%s: %s exited %d: %s", self._log_name, cmd, e.returncode, e.stderr)
            raise RuntimeError(e.stderr) from None
        return out.strip()

    def state_isunknown(self):
        """Slurm's "cannot contact the controller", or a submit host that did not answer:
        the job's state is unknown, and a running server is left running."""
        return super().state_isunknown() or (self.job_status or "").startswith(SUBMIT_HOST_DOWN)
