"""The jobs' spawner hook: forged job starts refused, a job ended exactly once.

:class:`JobsHook` is an entry of ``c.SpawnerCore.before_container_hooks``
(:func:`hub_ext.jobs.hubconfig.apply_jobs_config` puts it first):

- ``before_reserve``: a start of a ``job-*`` server whose profile and ``user_options["job"]``
  are not exactly those the hub stored for that job (a member forging
  ``POST /hub/api/users/<me>/servers/job-x``), or a start of any other server with a
  ``"job"`` option, is refused with 403 before anything is reserved or charged.  The
  hub's own start is let through, and the API token JupyterHub made for it
  (``Spawner.api_token``, with ``c.Spawner.server_token_scopes``) is kept as the job's
  (``server_token_id``): the only token whose report the hub takes
  (:mod:`.handlers`);
- ``after_stop``: the job's server stopped: :func:`finalise` sets COMPLETED or FAILED from
  the runner's report (which only the job's own server token can send), STOPPED when the
  member, an admin or the maximum run time stopped it, FAILED when its container ended
  without a report, whoever stopped it (JupyterHub's ``DELETE`` of the server too).  One
  conditional ``UPDATE`` (:func:`hub_ext.jobs.store.finish`): a second call changes
  nothing.  The ended job's server is then forgotten
  (:func:`hub_ext.jobs.lifecycle.forget_when_stopped`).
"""

from __future__ import annotations

from jupyterhub import orm
from tornado import web
from traitlets.config import SingletonConfigurable

from ..common.runs import JOB_PREFIX
from ..spawn.hooks import Hook
from . import store
from .lifecycle import forget_when_stopped, job_options, jobs_of

__all__ = ["JOB_PREFIX", "JobsHook", "finalise"]

FORGED = (
    "Servers named job-… run the hub's notebook jobs and are started by the hub only: "
    "create a notebook job instead (Jupyter Scheduler, or POST /hub/api/gpuhub/jobs)."
)


class JobsHook(Hook, SingletonConfigurable):
    """Notebook jobs' part of every start and stop (see the module doc)."""

    name = "jobs"

    def _db(self, spawner):
        return spawner.db_session() or spawner.user.db

    async def before_reserve(self, spawner) -> None:
        """Refuse (403) a job start the hub did not build, or a job option on another
        server.  Raises ``tornado.web.HTTPError``."""
        jobs_of(getattr(spawner.user, "settings", None) or {})
        name = spawner.name or ""
        job = getattr(spawner, "job", None)
        if not name.startswith(JOB_PREFIX):
            if job is not None:
                self.log.warning("%s: a job option on a server that is no job", spawner._log_name)
                raise web.HTTPError(403, FORGED)
            return
        row = store.by_server(self._db(spawner), spawner.user.name, name)
        expected = job_options(row) if row is not None else None
        if (
            expected is None
            or row.status not in ("CREATED", "QUEUED")
            or job != expected["job"]
            or spawner.profile_slug != expected["profile"]
        ):
            self.log.warning(
                "Refusing the start of %s: not the hub's own start of its job (%s)",
                spawner._log_name,
                "no such job" if row is None else f"job {row.id}, {row.status}",
            )
            raise web.HTTPError(403, FORGED)
        token = (
            orm.APIToken.find(self._db(spawner), spawner.api_token) if spawner.api_token else None
        )
        if token is not None and row.server_token_id != token.id:
            store.set_server_token(self._db(spawner), row, token.id)

    async def before_container(self, spawner) -> None:
        """Nothing to take: the job's row is its record."""

    async def undo(self, spawner) -> None:
        """Nothing to give back."""

    async def after_stop(self, spawner) -> None:
        """The job's server stopped (or its container ended): end the job, once.  A start
        that failed before the container ran is ended by :mod:`.lifecycle` instead.
        Never raises."""
        if not getattr(spawner, "job", None):
            return
        try:
            db = self._db(spawner)
            row = store.by_server(db, spawner.user.name, spawner.name or "")
            if row is None or row.status not in store.ACTIVE:
                return
            ran = row.start_time is not None or getattr(spawner, "stop_reason", "") == "job_ended"
            if ran and await finalise(spawner.user, row, spawner):
                forget_when_stopped(spawner.user, spawner.name)
        except Exception:
            self.log.exception("Job of %s not finalised", spawner._log_name)


def _ended_unreported(spawner) -> str:
    """Why a job ended without a report, for its member: the ``stop_detail`` its backend's
    poll found ("Slurm job 812 was cancelled outside the hub").  A job whose node went down
    (stop reason ``node_down``: "node node2 down: power failure") is not run again by the
    cluster (the Slurm backend submits with ``--no-requeue``): the member is told to create
    it again."""
    detail = getattr(spawner, "stop_detail", None) or "the hub found it gone"
    if getattr(spawner, "stop_reason", None) == "node_down":
        return (
            f"The job stopped because the node it ran on went down ({detail}). "
            "It does not run again by itself: create the job again."
        )
    return f"The job ended without a report: {detail}."


async def finalise(user, row, spawner=None) -> bool:
    """End ``row``'s job from what is known: the report its server's token sent (COMPLETED
    when its exit code is 0, else FAILED with its error line), else STOPPED when a stop
    was asked (STOPPING), else FAILED (its container ended without a report).  Nothing in
    the member's workspace counts as a report.  Returns whether this call ended it (False:
    it had ended already)."""
    db = user.db
    report = row.reported
    if isinstance(report, dict) and "exit_code" in report:
        try:
            code = int(report["exit_code"])
        except (TypeError, ValueError):
            code = 1
        error = str(report.get("error") or "")[: store.MESSAGE_CHARS]
        if code == 0:
            status, message = "COMPLETED", "Completed."
        else:
            status, message = "FAILED", error or f"The notebook failed (exit code {code})."
        if row.status == "STOPPING" and code != 0:
            status, message = "STOPPED", row.status_message or "Stopped."
    elif row.status == "STOPPING":
        status, message, code = "STOPPED", row.status_message or "Stopped.", None
    else:
        status, message, code = "FAILED", _ended_unreported(spawner), None
    done = store.finish(db, row, status, message, exit_code=code)
    if done:
        jobs_of(user.settings).log.info(
            "Job %s of %s ended: %s (%s)", row.id, user.name, status, message
        )
    return done
