"""A notebook job's life in the hub: created, queued in the line, running, stopped, settled.

A job is a JupyterHub named server of its member, ``job-<12 hex>``, that the hub starts
itself with ``User.spawn(server_name, options)`` in the background (docs:
howto/notebook-jobs and reference/jobs-api).  So a job goes through the same start as any
server: the profile, the credits hook's ``before_reserve`` (402), the line (it waits there
holding no GPU and no debit: ``user_options["job"]`` asks to wait,
:mod:`hub_ext.spawn.choice`), the pool's exclusive GPUs, the debit, the meter, the run
record.  Its container runs ``gpuhub-notebook-job`` instead of JupyterLab.

- :func:`create`, in the member's turn (:mod:`.intake`): every check of :mod:`.checks`,
  cheapest first (the body, the profile, the size of the job's options, the per-member
  limit; the notebook, read and parsed away from the event loop; the credits hook's
  question on the job's own spawner); only then the input is copied into the job's
  output folder in the workspace (owned by the member) and the job is QUEUED.  A refusal
  leaves nothing: no row, no server, no file, no debit.
- :func:`start_next`: a member's queued jobs on one profile start one after the other,
  each once the one before has its GPU (the line holds one place per member and
  profile: :func:`start_blocked`); asked when a job is created, when a job's start ends
  and by the keeper.
- :func:`launch`: ``User.spawn`` as a task; when it returns the job is IN_PROGRESS with its
  ``start_time``; when it fails before running, the job ends (FAILED, or STOPPED when the
  member stopped it) here, the only end that :mod:`.hook` does not decide.
- :func:`stop`: a queued job leaves the line (its waiting start ends); a running one's
  server is stopped now (the GPU goes back to the line's head in the same step).
- :class:`Jobs`: the settings (``c.Jobs.*``) and the keeper, a pass every
  ``c.Jobs.check_interval`` seconds: the maximum run time, queued jobs to start (after a
  hub restart, or once the member's start before them has its GPU), jobs whose server a
  restarted hub found running or gone, and job servers left behind by ended jobs (a job's
  server never outlives its job).  It runs from the hub's start (:func:`keep_from_start`).
"""

from __future__ import annotations

import asyncio
import os

from jupyterhub import orm
from jupyterhub.slugs import is_valid_display_name, normalise_unicode
from tornado import web
from traitlets import Float, Int
from traitlets.config import SingletonConfigurable

from ..common.periodic import after_start, ensure_task, every
from ..common.runs import JOB_PREFIX
from ..common.server_key import ServerKey
from ..line.core import Line, LineRefused
from ..spawn.choice import json_size
from ..spawn.profiles import job_max_seconds
from . import store
from .checks import DIR_FLAGS, JobRefused, job_profile, output_names, read_request
from .intake import MemberTurns, load_notebook
from .workload import NotebookJob

__all__ = [
    "Jobs",
    "create",
    "forget_when_stopped",
    "job_options",
    "keep_from_start",
    "launch",
    "start_blocked",
    "start_next",
    "stop",
]


class Jobs(SingletonConfigurable):
    """The notebook jobs' settings and their keeper (one per hub process)."""

    per_user = Int(
        4,
        config=True,
        help="""Jobs one member may have queued or running (0: no limit);
        GPUHUB_JOBS_PER_USER.

            c.Jobs.per_user = 4
        """,
    )
    notebook_max_mib = Int(
        20,
        config=True,
        help="""The largest notebook a job takes, MiB; GPUHUB_JOB_NOTEBOOK_MAX_MIB.

            c.Jobs.notebook_max_mib = 20
        """,
    )
    request_interval = Float(
        0.5,
        config=True,
        help="""Seconds at least between two job requests of one member that the hub
        takes (the next waits its turn; 0: none).  A member's requests are taken one at
        a time in any case (hub_ext.jobs.intake).

            c.Jobs.request_interval = 0.5
        """,
    )
    check_interval = Float(
        5.0,
        config=True,
        help="""Seconds between the keeper's passes (maximum run time, queued jobs to
        start, servers found after a restart).

            c.Jobs.check_interval = 5
        """,
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        #: job id -> the task watching its start
        self.starting: dict[str, asyncio.Task] = {}
        #: each member's job requests, one at a time (:mod:`.intake`)
        self.turns = MemberTurns(interval=self.request_interval)
        self.users = None
        self._keeper = None

    def ensure_keeper(self, users) -> None:
        """Start the keeper once per hub process; ``users``: JupyterHub's ``UserDict``
        (the hub's settings ``"users"``).  Needs a running event loop."""
        if users is not None:
            self.users = users
        if self.users is None:
            return
        self._keeper = ensure_task(
            self._keeper,
            lambda: every(lambda: self.check_interval, self.check_once, self.log, "Jobs pass"),
        )

    def user(self, name: str):
        """JupyterHub's ``User`` of ``name``, or None."""
        orm_user = orm.User.find(self.users.db, name)
        return self.users[orm_user] if orm_user is not None else None

    async def check_once(self) -> None:
        """One pass of the keeper over the jobs that have not ended, then over the job
        servers left behind by ended ones (:meth:`forget_leftovers`)."""
        db = self.users.db
        rows = store.load(db, statuses=store.ACTIVE)
        to_start = set()
        for row in rows:
            user = self.user(row.user)
            if user is None:
                store.finish(db, row, "FAILED", "Its member was deleted.")
                continue
            spawner = user.spawners.get(row.server_name)
            task = self.starting.get(row.id)
            if task is not None and not task.done():
                continue
            if row.status == "QUEUED":
                if spawner is not None and spawner.ready:
                    mark_running(db, row)
                elif spawner is None or not spawner.active:
                    to_start.add((row.user, row.profile))
            elif row.status == "IN_PROGRESS":
                started = (row.start_time or row.create_time) / 1000
                if row.max_seconds and store.ms() / 1000 - started > row.max_seconds:
                    await stop(
                        user,
                        row,
                        f"Stopped: it ran longer than its profile's maximum run time "
                        f"({row.max_seconds} s).",
                    )
                elif spawner is None or not spawner.active:
                    await ended_unseen(user, row)
            elif row.status == "STOPPING" and (spawner is None or not spawner.active):
                store.finish(db, row, "STOPPED", row.status_message or "Stopped.")
        for name, profile in sorted(to_start):
            user = self.user(name)
            if user is not None:
                start_next(user, profile)
        self.forget_leftovers({(r.user, r.server_name) for r in rows})

    def forget_leftovers(self, active: set[tuple[str, str]]) -> None:
        """Forget every ``job-…`` server that runs no job that has not ended (``active``:
        (member, server) of those that have not) and is not running: a job's server never
        outlives its job, however it stopped."""
        db = self.users.db
        found = db.query(orm.Spawner).filter(
            orm.Spawner.name.startswith(JOB_PREFIX, autoescape=True),
            orm.Spawner.server_id.is_(None),
        )
        for orm_spawner in list(found):
            if orm_spawner.user is None or (orm_spawner.user.name, orm_spawner.name) in active:
                continue
            user = self.users[orm_spawner.user]
            spawner = user.spawners.get(orm_spawner.name)
            if spawner is None or not spawner.active:
                self.log.info(
                    "Forgetting %s's server %s: its job ended", user.name, orm_spawner.name
                )
                forget(user, orm_spawner.name)


def keep_from_start(app) -> None:
    """Make the JupyterHub application ``app`` start the jobs' keeper when it starts, so
    that a restarted hub ends, starts and settles its jobs by itself, before any request
    about jobs.  ``app.start`` is wrapped, as
    :func:`hub_ext.credits.unsettled.settle_at_start` does (JupyterHub has no start-up
    hook for extensions); the keeper starts once ``start`` is done (the proxy and the
    API up; ``app.users`` was filled by ``initialize``).  Wrapping twice is a no-op."""
    after_start(
        app, "keeps_jobs", lambda: Jobs.instance(config=app.config).ensure_keeper(app.users)
    )


def jobs_of(settings) -> Jobs:
    """The hub's :class:`Jobs`, configured from the hub's config (tornado ``settings``)."""
    jobs = Jobs.instance(config=settings.get("config"))
    jobs.ensure_keeper(settings.get("users"))
    return jobs


def the_line(db) -> Line:
    line = Line.instance()
    line.attach(db)
    return line


def _profile_of(spawner) -> str | None:
    """The profile a server starts on: the one its start loaded, else the one asked."""
    options = spawner.user_options if isinstance(spawner.user_options, dict) else {}
    return getattr(spawner, "profile_slug", "") or options.get("profile")


def start_blocked(user, row) -> bool:
    """Whether another start of ``row``'s member on the job's profile comes first: one with
    a place in line (or granted and still starting), or one under way (a start of one of
    her servers or jobs that has no place yet: Docker's reservation, a Slurm job not yet
    read from the queue).  The line keeps one place per member and profile, so the job
    starts once that one has its GPU (:func:`start_next`)."""
    line = the_line(user.db)
    try:
        line.check_one_place(ServerKey(user.name, row.server_name), row.profile, row.profile)
    except LineRefused:
        return True
    return any(
        name != row.server_name
        and spawner.pending == "spawn"
        and _profile_of(spawner) == row.profile
        for name, spawner in list(user.spawners.items())
    )


def job_options(row) -> dict:
    """The ``user_options`` of a job's server, built from its row only (the jobs hook
    refuses a start of a ``job-*`` server with any other options)."""
    return {
        "profile": row.profile,
        "job": {
            "id": row.id,
            "input": row.input_path,
            "cwd": row.cwd,
            "output_dir": row.output_dir,
            "outputs": dict(row.outputs),
            "parameters": dict(row.parameters),
            "max_seconds": int(row.max_seconds or 0),
        },
    }


# -- create ------------------------------------------------------------------------------


async def create(jobs: Jobs, user, body) -> store.JobRow:
    """Check and create a job of ``user`` from a ``CreateJob`` body, in the member's turn
    (:attr:`Jobs.turns`: nothing else of hers is created meanwhile); returns its row
    (QUEUED, its start launched or waiting behind her other job on the same profile), or
    the job made before with the same idempotency token.  Raises
    :class:`~.checks.JobRefused` (400, 402, 403, 404, 409, 413, 501, 503) having left
    nothing behind.

    What is cheap is asked first (:mod:`.checks`): the body, the profile, the size of the
    job's options, the idempotency token, the per-member limit; then the notebook, read
    and parsed away from the event loop (:mod:`.intake`); then the price, which needs the
    job's server and row in the hub database (the jobs hook checks a start against its
    row): writes that hold up the event loop, so none is made for a request refused
    before."""
    request = read_request(body)
    visible, everything = await user.spawner.get_profiles()
    values = new_job(user.name, request, job_profile(visible, everything, request.profile))
    limit = user.spawner.user_options_max_bytes
    size = json_size(job_options(store.JobRow(**values)))
    if size > limit:  # load_profile's 413, in a job's words
        raise JobRefused(
            413,
            f"The job's parameters and file names come to {size} bytes; a job takes at "
            f"most {limit}. Give fewer or shorter parameters, or a shorter path.",
        )
    db = user.db
    if request.idempotency_token:
        earlier = store.by_token(db, user.name, request.idempotency_token)
        if earlier is not None:
            return earlier
    active = store.count_active(db, user.name)
    if jobs.per_user and active >= jobs.per_user:
        raise JobRefused(
            409,
            f"You have {active} notebook jobs queued or running; each member may have "
            f"{jobs.per_user}. Wait for one to end, or stop one.",
        )
    if not user.spawner.runs(NotebookJob):
        raise JobRefused(501, NotebookJob.not_run())
    try:
        workspace, uid, gid = await user.spawner.job_workspace()
    except web.HTTPError as e:
        raise refused(e) from None
    data = await load_notebook(workspace, request.input_uri, jobs.notebook_max_mib * 2**20)
    server_name = values["server_name"]
    spawner = user.get_or_create_spawner(server_name, display_name(values["name"]))
    row = None
    try:
        row = store.insert(db, **values)
        # the start's own checks, before anything is reserved: the profile as the
        # spawner loads it, and the hooks (the credits hook: the first interval, 402)
        spawner.user_options = job_options(row)
        await spawner.load_profile()
        await spawner.check_hooks()
        await asyncio.to_thread(write_input, workspace, row.input_path, data, uid, gid)
    except web.HTTPError as e:
        forget(user, server_name, row)
        raise refused(e) from None
    except BaseException:
        forget(user, server_name, row)
        raise
    store.set_status(db, row, "QUEUED", "Waiting for its GPU.")
    jobs.log.info(
        "%s created job %s (%s, profile %s) from %s",
        user.name,
        row.id,
        row.server_name,
        row.profile,
        request.input_uri,
    )
    start_next(user, row.profile)
    return row


def new_job(user: str, request, profile: dict) -> dict:
    """The columns of a new job of ``user`` from its checked ``request``
    (:class:`~.checks.JobRequest`) on ``profile``: its id and server, where its input copy
    and outputs go (:func:`~.checks.output_names`), its maximum run time; CREATED (QUEUED
    once it passed every check)."""
    job_id = store.new_id()
    created = store.ms()
    out, outputs, input_copy = output_names(
        request.input_uri, job_id, created, request.output_formats
    )
    return dict(
        id=job_id,
        user=user,
        name=request.name or os.path.splitext(os.path.basename(request.input_uri))[0],
        profile=profile["slug"],
        server_name=store.server_name_of(job_id),
        input_path=input_copy,
        input_filename=os.path.basename(request.input_uri),
        cwd=os.path.dirname(os.path.normpath(request.input_uri)),
        output_dir=out,
        outputs=outputs,
        output_formats=request.output_formats,
        parameters=request.parameters,
        idempotency_token=request.idempotency_token,
        status="CREATED",
        create_time=created,
        update_time=created,
        max_seconds=job_max_seconds(profile),
    )


def refused(error: web.HTTPError) -> JobRefused:
    """A spawner's refusal (``tornado.web.HTTPError``) as the job's."""
    return JobRefused(error.status_code, error.log_message or error.reason or "Refused.")


def forget(user, server_name: str, row=None) -> None:
    """Delete a job's server (not running) from JupyterHub's tables, and ``row`` when
    given: a refused job leaves nothing, an ended one no named server in the member's
    list.  As JupyterHub's ``DELETE .../servers/<name>?remove=true`` does, without
    ``delete_forever`` (the workspace is the member's, never a job's)."""
    db = user.db
    if row is not None and store.get(db, row.id) is not None:
        store.delete(db, row)
    if server_name not in user.orm_spawners:
        return
    spawner = user.spawners[server_name]
    if spawner.active:
        return
    db.delete(spawner.orm_spawner)
    user.spawners.pop(server_name, None)
    db.commit()


def write_input(workspace: str, path: str, data: bytes, uid: int, gid: int) -> None:
    """Write ``data`` to ``path`` (relative) in ``workspace``, making its folders, all
    owned by ``uid:gid`` (mode 0700/0600), without following a link anywhere (each folder
    opened by descriptor with ``O_NOFOLLOW``; the file made with ``O_EXCL``).  Raises
    :class:`~.checks.JobRefused` (403) when something on the way is a link."""
    parts = path.split("/")
    fds = [os.open(workspace, DIR_FLAGS)]
    try:
        for name in parts[:-1]:
            try:
                os.mkdir(name, 0o700, dir_fd=fds[-1])
                made = True
            except FileExistsError:
                made = False
            fd = os.open(name, DIR_FLAGS, dir_fd=fds[-1])
            fds.append(fd)
            if made:
                os.fchown(fd, uid, gid)
            elif os.fstat(fd).st_uid not in (uid, 0):
                raise JobRefused(403, f"The folder {name} in your workspace is not yours.")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(parts[-1], flags, 0o600, dir_fd=fds[-1])
        try:
            os.fchown(fd, uid, gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as e:
        raise JobRefused(
            403,
            f"The job's folder {os.path.dirname(path)} cannot be made in your "
            f"workspace: {e.strerror}.",
        ) from None
    finally:
        for fd in fds:
            os.close(fd)


# -- start --------------------------------------------------------------------------------


def start_next(user, profile: str) -> store.JobRow | None:
    """Start the oldest of ``user``'s queued jobs on ``profile`` whose start is not under
    way, unless another start of hers on that profile comes first
    (:func:`start_blocked`): a member's jobs on one profile start one after the other, each
    once the one before has its GPU.  Returns the job started, or None."""
    jobs = Jobs.instance()
    line = the_line(user.db)
    queued = [r for r in store.load(user.db, user.name, ("QUEUED",)) if r.profile == profile]
    for row in reversed(queued):  # oldest first
        task = jobs.starting.get(row.id)
        spawner = user.spawners.get(row.server_name)
        if (
            (task is not None and not task.done())
            or ServerKey(row.user, row.server_name) in line.places
            or (spawner is not None and spawner.active)
        ):
            continue  # started already (a place kept through a restart: the line's keeper)
        if start_blocked(user, row):
            return None
        jobs.log.info("Job %s of %s: starting its server", row.id, row.user)
        launch(user, row)
        return row
    return None


def launch(user, row) -> asyncio.Task:
    """Start the job's server in the background (``User.spawn``, as JupyterHub's
    ``spawn_single_user`` does, without a proxy route: nobody browses a job).  The
    server's start is pending from this call on, with the job's options (a start
    :func:`start_blocked` sees at once)."""
    jobs = Jobs.instance()
    name, job_id, profile = row.server_name, row.id, row.profile
    spawner = user.get_or_create_spawner(name, display_name(row.name), replace_failed=True)
    options = job_options(row)
    spawner.user_options = options
    spawner._spawn_pending = True

    async def spawn():
        try:
            await user.spawn(name, options=options)
        finally:
            spawner._spawn_pending = False

    start = asyncio.ensure_future(spawn())
    spawner._spawn_future = start
    task = asyncio.ensure_future(_watch(user, job_id, name, profile, start))
    jobs.starting[job_id] = task
    return task


def display_name(title: str) -> str:
    """The job's server as the member's home page and the admin panel list it: "Notebook
    job: <the job's name>", within JupyterHub's rules for a display name."""
    words = " ".join(normalise_unicode(title).split())[:200]
    name = f"Notebook job: {words}"
    return name if is_valid_display_name(name) else "Notebook job"


def mark_running(db, row) -> None:
    """A queued job's server started: IN_PROGRESS since now (a job being stopped keeps
    STOPPING, with its start time)."""
    if row.status == "STOPPING":
        store.set_status(db, row, "STOPPING", only=("STOPPING",), start_time=store.ms())
    elif store.set_status(
        db, row, "IN_PROGRESS", "Running.", only=("CREATED", "QUEUED"), start_time=store.ms()
    ):
        Jobs.instance().log.info("Job %s of %s runs (%s)", row.id, row.user, row.server_name)


async def _watch(user, job_id: str, name: str, profile: str, start: asyncio.Future) -> None:
    """The job's start ended: the job runs (IN_PROGRESS) or ends (FAILED, STOPPED); either
    way the member's next job on the profile may start (:func:`start_next`)."""
    jobs = Jobs.instance()
    db = user.db
    try:
        await start
    except Exception as e:  # noqa: BLE001 - every failed start ends the job
        why = getattr(e, "jupyterhub_message", None) or getattr(e, "log_message", None) or str(e)
        row = store.get(db, job_id)
        if row is not None and row.status in store.ACTIVE and row.start_time is None:
            if row.status == "STOPPING":
                store.finish(db, row, "STOPPED", row.status_message or "Stopped.")
            else:
                store.finish(db, row, "FAILED", f"It could not start: {why}")
            jobs.log.info("Job %s of %s ended before it ran: %s", job_id, user.name, why)
        forget(user, name)
        start_next(user, profile)
        return
    finally:
        jobs.starting.pop(job_id, None)
    spawner = user.spawners[name]
    spawner._spawn_future = None
    spawner.add_poll_callback(server_ended, user, name)
    row = store.get(db, job_id)
    if row is not None:
        mark_running(db, row)
    start_next(user, profile)
    if row is not None and row.status == "STOPPING":  # stopped while it was starting
        await stop_server(user, name)


async def server_ended(user, name: str) -> None:
    """JupyterHub's poll found a job's server ended (its container exited): stop it as
    JupyterHub's own poll callback does, then forget the server."""
    await stop_server(user, name)


async def stop_server(user, name: str) -> None:
    """Stop a job's server (its stop hooks finalise the job: :mod:`.hook`) and forget it."""
    if name in user.spawners and user.spawners[name].active:
        spawner = user.spawners[name]
        if spawner.pending == "stop":
            return
        await user.stop(name)
    row = store.by_server(user.db, user.name, name)
    if row is not None and row.status in store.ACTIVE:
        await ended_unseen(user, row)
    forget(user, name)


def forget_when_stopped(user, name: str) -> asyncio.Task:
    """Forget an ended job's server once JupyterHub's stop of it is over: a stop the hub
    did not ask for (JupyterHub's ``DELETE /users/<name>/servers/<server>``, its poll)
    leaves the named server in JupyterHub's tables otherwise.  Gives up after a minute
    (the keeper's :meth:`Jobs.forget_leftovers` finds it later)."""

    async def later():
        for _ in range(600):
            spawner = user.spawners.get(name)
            if spawner is None or not spawner.active:
                break
            await asyncio.sleep(0.1)
        forget(user, name)

    return asyncio.ensure_future(later())


async def ended_unseen(user, row) -> None:
    """The job's server is gone and no stop hook ended the job (a hub that was down when
    it ended): end it from its report, once."""
    from .hook import finalise

    await finalise(user, row, None)


# -- stop ---------------------------------------------------------------------------------


async def stop(user, row, why: str) -> None:
    """Stop a job now: a queued one leaves the line (or its start is given up), a running
    one's server stops (the GPU goes back to the line's head in the same step); ``why``
    becomes its status message (STOPPED).  An ended job is left as it is."""
    db = user.db
    if row.status not in store.ACTIVE:
        return
    store.set_status(db, row, "STOPPING", why)
    line = the_line(db)
    key = ServerKey(user.name, row.server_name)
    task = Jobs.instance().starting.get(row.id)
    if key in line.places:
        line.remove(key, "left", why)  # the waiting start ends; _watch ends the job
    elif task is not None and not task.done():
        return  # the start ends first; _watch then stops the server
    elif row.server_name in user.spawners and user.spawners[row.server_name].active:
        await stop_server(user, row.server_name)
    else:
        store.finish(db, row, "STOPPED", why)
        forget(user, row.server_name)
