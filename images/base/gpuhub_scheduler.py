"""Jupyter Scheduler's "Create Notebook Job", run by the hub on a GPU (docs/howto/notebook-jobs.md).

Jupyter Scheduler (the official JupyterLab extension for notebook jobs) normally runs a job
inside the member's own server and keeps its records in a SQLite file there. On GPU Cluster
Hub the hub runs it: a job waits in the same line as servers, holds a GPU only while it
computes, and outlives this server. So this server keeps no record of a job and runs nothing;
every call of the Scheduler's REST API (``/user/<name>/scheduler/...``) becomes one request to
the hub's jobs API, ``$JUPYTERHUB_API_URL/gpuhub/jobs...``, authorised by this server's own
``$JUPYTERHUB_API_TOKEN`` (scope ``custom:gpuhub:jobs!user``: this member's jobs only).

The image's ``/etc/jupyter/jupyter_server_config.json`` plugs it in::

    c.SchedulerApp.scheduler_class = "gpuhub_scheduler.HubScheduler"
    c.SchedulerApp.environment_manager_class = "gpuhub_scheduler.HubEnvironments"
    c.SchedulerApp.db_url = "sqlite://"  # Jupyter Scheduler makes its tables at start; in memory

Paths: the Scheduler names files relative to this server's root (``work/train.ipynb``), the
hub relative to the member's workspace (``train.ipynb``), which the server sees at
``HubScheduler.workspace``; a notebook outside it cannot run as a job (its container sees only
the workspace). Outputs are written by the job straight into the workspace, so they are
"downloaded" as soon as they exist.

Errors: Jupyter Scheduler's handlers answer a ``SchedulerError`` with HTTP 500 and its text as
``message``, which the Create Notebook Job form shows; the hub's own words (``{"message"}``
of its 4xx) are passed on unchanged.
"""

from __future__ import annotations

import json
import os
import posixpath
from urllib.parse import quote, urlencode

from jupyter_scheduler.environments import EnvironmentManager, EnvironmentRetrievalError
from jupyter_scheduler.exceptions import SchedulerError
from jupyter_scheduler.models import (
    CountJobsQuery,
    CreateJob,
    DescribeJob,
    JobFeature,
    JobFile,
    ListJobDefinitionsResponse,
    ListJobsQuery,
    ListJobsResponse,
    RuntimeEnvironment,
    Status,
    UpdateJob,
)
from jupyter_scheduler.scheduler import BaseScheduler
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Type, Unicode, default

#: Output formats a job can write, with the Scheduler's labels; the log comes with every job.
OUTPUT_FORMATS = {"ipynb": "Notebook", "html": "HTML"}
LOG_LABEL = "Log"

NO_DEFINITIONS = (
    "Scheduled jobs (job definitions) are not offered on this hub: run the notebook now "
    "with 'Run now', and it waits for a GPU in the hub's line."
)


class HubRefused(SchedulerError):
    """The hub answered 4xx/5xx; ``str()`` is its ``message``, meant for the member."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class HubJobs:
    """The hub's jobs API, as this server's own token: one request helper with a label.

    ``api_url`` and ``token`` default to ``$JUPYTERHUB_API_URL`` (e.g.
    ``http://127.0.0.1:8081/hub/api``) and ``$JUPYTERHUB_API_TOKEN``, which JupyterHub gives
    every server it starts. ``request()`` is async; it raises :class:`HubRefused` with the
    hub's message, or with a sentence when the hub cannot be reached. Timeouts in seconds.
    """

    def __init__(self, api_url: str | None = None, token: str | None = None, timeout=30.0):
        self.api_url = (api_url or os.environ.get("JUPYTERHUB_API_URL", "")).rstrip("/")
        self.token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.timeout = timeout

    async def request(self, label: str, method: str, path: str = "", body=None, query=None):
        """``method`` on ``<api_url>/gpuhub/jobs<path>``; returns the decoded JSON (None for
        an empty answer such as 204)."""
        if not self.api_url or not self.token:
            raise HubRefused(
                "Notebook jobs need a server started by the hub (JUPYTERHUB_API_URL and "
                "JUPYTERHUB_API_TOKEN are not set).",
                500,
            )
        url = f"{self.api_url}/gpuhub/jobs{path}"
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        request = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None and method != "POST" else json.dumps(body or {}),
            request_timeout=self.timeout,
            connect_timeout=self.timeout,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.response is None:  # tornado's 599: no answer at all
                raise HubRefused(
                    f"The hub did not answer ({label}); try again in a minute.", 503
                ) from e
            raise HubRefused(_message(e.response.body, e.code, label), e.code) from e
        except OSError as e:
            raise HubRefused(f"The hub did not answer ({label}): {e.strerror or e}.", 503) from e
        return json.loads(response.body) if response.body else None


def _message(body: bytes, status: int, label: str) -> str:
    """The hub's ``{"message": ...}``, or a sentence naming the status when there is none."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else f"The hub refused to {label} (HTTP {status})."


class HubJob(DescribeJob):
    """Jupyter Scheduler's ``DescribeJob`` with where the hub put the job's files
    (workspace-relative): ``output_dir``, ``outputs`` ({format: file}, "log" included) and
    ``input_path`` (the copy of the notebook the job runs)."""

    output_dir: str = ""
    outputs: dict = {}
    input_path: str = ""


class HubFeatures:
    """What the Create Notebook Job form offers (``JobFeature`` -> bool); read through
    ``HubScheduler.execution_manager_class`` by the Scheduler's ``/scheduler/config``. Nothing
    runs in this server, so this is not an execution manager of its own."""

    def supported_features(cls) -> dict:  # called as supported_features(cls) by the handler
        offered = {
            JobFeature.job_name,
            JobFeature.parameters,
            JobFeature.output_formats,
            JobFeature.idempotency_token,
            JobFeature.stop_job,
            JobFeature.delete_job,
        }
        return {feature: feature in offered for feature in JobFeature}


class HubScheduler(BaseScheduler):
    """Jupyter Scheduler's scheduler, forwarding every job call to the hub (module docstring).

    Methods are async (the Scheduler's handlers ``ensure_async`` them); each raises
    :class:`HubRefused` (a ``SchedulerError``) with the hub's message when it refuses.
    """

    #: Nothing runs or waits in this server: no task runner, no database.
    task_runner = None

    execution_manager_class = Type(
        default_value=HubFeatures,
        klass=object,
        help="What the Scheduler's form offers; see HubFeatures.",
    )

    workspace = Unicode(
        config=True,
        help="""Where the member's workspace (what a job sees) is in this server; notebooks
        outside it cannot run as jobs. Default: $GPUHUB_WORKSPACE_MOUNT, else /home/jovyan/work
        (the hub's ``c.SpawnerCore.workspace_mount``).

            c.HubScheduler.workspace = "/home/jovyan/work"
        """,
    )

    @default("workspace")
    def _default_workspace(self):
        return os.environ.get("GPUHUB_WORKSPACE_MOUNT") or "/home/jovyan/work"

    def __init__(self, root_dir, environments_manager, db_url=None, config=None, **kwargs):
        # db_url: Jupyter Scheduler's extension passes it to every scheduler; no records here.
        super().__init__(
            root_dir=root_dir, environments_manager=environments_manager, config=config, **kwargs
        )
        self.hub = HubJobs()

    # --- paths: this server's root <-> the member's workspace ---------------------------------

    def to_workspace(self, path: str) -> str:
        """A root-relative path of the Scheduler as a workspace-relative one; raises
        :class:`HubRefused` for a path outside the workspace."""
        full = posixpath.normpath(posixpath.join(self.root_dir, path))
        relative = posixpath.relpath(full, posixpath.normpath(self.workspace))
        if relative == ".." or relative.startswith("../"):
            shown = posixpath.relpath(self.workspace, self.root_dir)
            raise HubRefused(
                f"Only notebooks in your workspace ({shown}/) can run as jobs: a job sees your "
                f"workspace, not the rest of this server. Move {path} into {shown}/ first.",
                400,
            )
        return relative

    def to_root(self, path: str) -> str:
        """A workspace-relative path of the hub as the root-relative one the Scheduler uses."""
        return posixpath.relpath(posixpath.join(self.workspace, path), self.root_dir)

    def profile(self, environment: str) -> str:
        """The hub's profile slug of an environment the form sent: the Create Job form sends
        an environment's label (HubEnvironments), a REST client the slug; anything else goes
        to the hub unchanged, which names the valid choices."""
        profiles = getattr(self.environments_manager, "profiles", {})
        return profiles.get(environment, environment)

    # --- jobs ---------------------------------------------------------------------------------

    async def create_job(self, model: CreateJob) -> str:
        """POST /gpuhub/jobs; returns the hub's job id (a uuid4 with hyphens)."""
        if model.job_definition_id:
            raise HubRefused(NO_DEFINITIONS, 400)
        body = {
            "input_uri": self.to_workspace(model.input_uri),
            "name": model.name,
            "runtime_environment_name": self.profile(model.runtime_environment_name),
            "parameters": model.parameters or {},
            "output_formats": model.output_formats or ["ipynb"],
            "idempotency_token": model.idempotency_token,
        }
        created = await self.hub.request("create the job", "POST", "", body=body)
        return created["job_id"]

    async def get_job(self, job_id: str, job_files: bool | None = True) -> HubJob:
        """GET /gpuhub/jobs/<id>: the job with its place in line as ``status_message``."""
        found = await self.hub.request("read the job", "GET", f"/{quote(job_id)}")
        return self._job(found, job_files)

    async def list_jobs(self, query: ListJobsQuery) -> ListJobsResponse:
        """GET /gpuhub/jobs: this member's jobs (the hub filters by the token's member)."""
        found = await self.hub.request(
            "list your jobs",
            "GET",
            "",
            query={
                "status": query.status.value if query.status else None,
                "name": query.name,
                "max_items": query.max_items,
                "next_token": query.next_token,
            },
        )
        return ListJobsResponse(
            jobs=[self._job(job) for job in found.get("jobs", [])],
            total_count=found.get("total_count", 0),
            next_token=found.get("next_token"),
        )

    async def count_jobs(self, query: CountJobsQuery) -> int:
        """How many of this member's jobs have ``query.status`` (the list's total_count)."""
        found = await self.hub.request(
            "count your jobs", "GET", "", query={"status": query.status.value, "max_items": 1}
        )
        return int(found.get("total_count", 0))

    async def stop_job(self, job_id: str):
        """POST /gpuhub/jobs/<id>/stop: leaves the line, or stops the running job now."""
        await self.hub.request("stop the job", "POST", f"/{quote(job_id)}/stop")

    async def delete_job(self, job_id: str):
        """DELETE /gpuhub/jobs/<id>: stopped first if needed; its files stay in the workspace."""
        await self.hub.request("delete the job", "DELETE", f"/{quote(job_id)}")

    async def update_job(self, job_id: str, model: UpdateJob):
        """Only a stop is offered (what the Scheduler's Stop button sends)."""
        if model.status == Status.STOPPED:
            return await self.stop_job(job_id)
        raise HubRefused("A job cannot be changed once created; only stopped or deleted.", 400)

    def _job(self, found: dict, job_files: bool | None = True) -> HubJob:
        job = HubJob(**{"url": f"/jobs/{found.get('job_id')}", **found})
        if job.status == Status.QUEUED:
            # the hub's one line for the place: "Waiting for a GPU: 2nd in line, about 5 min"
            job.status_message = (found.get("place") or {}).get("message") or job.status_message
        if job_files:
            self.add_job_files(job)
        return job

    # --- files: written by the job in the workspace, nothing to download ----------------------

    def _input(self, model: HubJob) -> str:
        """The workspace-relative copy of the input the job ran (beside its outputs)."""
        return model.input_path or posixpath.join(model.output_dir, model.input_filename)

    def get_job_filenames(self, model: HubJob) -> dict:
        """{format: file name in the job's output folder}, "input" and "log" included."""
        names = {fmt: posixpath.basename(path) for fmt, path in model.outputs.items()}
        names["input"] = posixpath.basename(self._input(model))
        return names

    def get_local_output_path(self, model: HubJob, root_dir_relative: bool | None = False) -> str:
        """The job's output folder, where the hub's job wrote it (no copy is made)."""
        relative = self.to_root(model.output_dir)
        return relative if root_dir_relative else os.path.join(self.root_dir, relative)

    def get_staging_paths(self, model) -> dict:
        """The files themselves: the Scheduler's "download" finds each already in place."""
        if not isinstance(model, HubJob):
            return {}
        paths = {fmt: self.to_root(path) for fmt, path in model.outputs.items()}
        paths["input"] = self.to_root(self._input(model))
        return {fmt: os.path.join(self.root_dir, path) for fmt, path in paths.items()}

    def add_job_files(self, model: HubJob):
        """Each output, the log and the input copy as the job list's links (``file_path``
        None until the file exists); ``downloaded`` once every one of them does."""
        files = [(fmt, OUTPUT_FORMATS.get(fmt, fmt)) for fmt in model.output_formats or []]
        if "log" in model.outputs:
            files.append(("log", LOG_LABEL))
        files.append(("input", "Input"))
        where = {fmt: path for fmt, path in model.outputs.items()}
        where["input"] = self._input(model)
        model.job_files = []
        for fmt, label in files:
            path = self.to_root(where[fmt]) if fmt in where else None
            model.job_files.append(
                JobFile(
                    display_name=label,
                    file_format=fmt,
                    file_path=path if path and self.file_exists(path) else None,
                )
            )
        model.downloaded = all(f.file_path for f in model.job_files)

    # --- job definitions (scheduled jobs): not offered ----------------------------------------

    def list_job_definitions(self, query) -> ListJobDefinitionsResponse:
        return ListJobDefinitionsResponse(job_definitions=[], total_count=0)

    def _no_definitions(self, *args, **kwargs):
        raise HubRefused(NO_DEFINITIONS, 400)

    create_job_definition = update_job_definition = delete_job_definition = _no_definitions
    get_job_definition = create_job_from_definition = _no_definitions


class HubEnvironments(EnvironmentManager):
    """The hub's profiles that run jobs, as the Scheduler's "Environment" list.

    GET /gpuhub/jobs/environments; each label as the hub words it, e.g. "PyTorch, 1 GPU,
    1.00 credits/h, 1 of 2 free" (free GPUs at the moment the form opened). Raises
    ``EnvironmentRetrievalError`` with the hub's message when the hub refuses.

    Each environment's ``name`` is its label too: Jupyter Scheduler 2.12's form shows an
    environment's *name* in its list, keeps the chosen one's *label* as its value and finds
    it again by name (its own Conda manager makes both the same), so a slug as name showed
    "pytorch" and sent the label. ``profiles`` maps every label listed to its slug, for
    :meth:`HubScheduler.profile` (the same instance serves both; jupyter_scheduler.extension).

    With a single environment the form shows no Environment list at all (it takes that
    one); the label is then that environment's only "compute type", which the form shows
    as a list of one, selected ("Compute type: PyTorch, 1 GPU, 1.00 credits/h, 1 of 2
    free"). The compute type a job is created with is not sent to the hub.
    """

    def __init__(self, hub: HubJobs | None = None):
        self.hub = hub or HubJobs()
        #: {label: profile slug} of every environment listed by this server, labels kept:
        #: a form opened before the free count changed still sends the label it showed
        self.profiles: dict[str, str] = {}

    async def list_environments(self) -> list[RuntimeEnvironment]:
        try:
            found = await self.hub.request("list the job environments", "GET", "/environments")
        except HubRefused as e:
            raise EnvironmentRetrievalError(str(e)) from e
        found = found.get("environments", [])
        environments = []
        for env in found:
            metadata = {k: str(v) for k, v in (env.get("metadata") or {}).items() if v is not None}
            self.profiles[env["label"]] = env["name"]
            shown = {"name": env["label"], "metadata": {**metadata, "profile": env["name"]}}
            if len(found) == 1:
                # the form shows no Environment list for a single environment; its "Compute
                # type" list, shown whenever the environment has compute types, then
                # carries the label: GPUs, price and free GPUs are seen before Create
                shown.update(compute_types=[env["label"]], default_compute_type=env["label"])
            environments.append(RuntimeEnvironment(**{**env, **shown}))
        return environments

    def manage_environments_command(self) -> str:
        return ""

    def output_formats_mapping(self) -> dict[str, str]:
        return {**OUTPUT_FORMATS, "log": LOG_LABEL}
