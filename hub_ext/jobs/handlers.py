"""The notebook jobs' REST endpoints (``c.JupyterHub.extra_handlers``), JSON in Jupyter
Scheduler's shapes so that the plugin in a member's server is thin (docs:
reference/jobs-api).

- ``GET /hub/api/gpuhub/jobs/environments``: the profiles open to the member that run jobs;
- ``POST /hub/api/gpuhub/jobs``: create (``CreateJob``) -> 201 ``{"job_id"}``;
- ``GET /hub/api/gpuhub/jobs``: ``{"jobs": [DescribeJob], "total_count", "next_token"}``;
- ``GET /hub/api/gpuhub/jobs/<id>``: one, with ``output_dir``, ``outputs`` and, while it
  waits, its ``place`` in line;
- ``POST /hub/api/gpuhub/jobs/<id>/stop`` and ``DELETE /hub/api/gpuhub/jobs/<id>``: 204;
- ``POST /hub/api/gpuhub/jobs/<id>/report``: the runner's ``{"exit_code", "error"}``, from
  the job's own server token only; 204, and the server is stopped.

All need the custom scope ``custom:gpuhub:jobs`` (:data:`JOBS_SCOPE`); with the filter
``!user=<name>`` (what members and their servers hold: ``custom:gpuhub:jobs!user``) a
request sees and makes that member's jobs only, and another member's job is 404.  Errors
are JSON ``{"status", "message"}`` in plain words; nothing is started or charged.
"""

from __future__ import annotations

import re

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from ..common.member_api import allowed_users, json_body, own_member, reply
from ..line.order import minutes, ordinal
from ..spawn.profiles import Selection, job_max_seconds, jobs_allowed, profile_overrides
from . import lifecycle, store
from .checks import OUTPUT_FORMATS, JobRefused

__all__ = ["JOBS_SCOPE", "handlers"]

JOBS_SCOPE = "custom:gpuhub:jobs"
#: the largest request body accepted (bytes)
MAX_BODY_BYTES = 256 * 1024
#: a job id as Jupyter Scheduler writes it (a uuid4 with hyphens)
JOB_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
MAX_ITEMS = 1000


def model(row: store.JobRow, base_url: str) -> dict:
    """A job as Jupyter Scheduler's ``DescribeJob``, plus the hub's ``output_dir`` and
    ``outputs`` ({format: workspace-relative file}, the log included)."""
    files = [
        {"display_name": fmt, "file_format": fmt, "file_path": path}
        for fmt, path in sorted(row.outputs.items())
        if fmt in row.output_formats or fmt == "log"
    ]
    return {
        "job_id": row.id,
        "name": row.name,
        "input_filename": row.input_filename,
        "runtime_environment_name": row.profile,
        "runtime_environment_parameters": {},
        "output_formats": list(row.output_formats),
        "parameters": dict(row.parameters),
        "idempotency_token": row.idempotency_token,
        "job_definition_id": None,
        "tags": [],
        "output_filename_template": "{{input_filename}}-{{create_time}}",
        "compute_type": None,
        "package_input_folder": False,
        "packaged_files": [],
        "status": row.status,
        "status_message": row.status_message,
        "create_time": row.create_time,
        "update_time": row.update_time,
        "start_time": row.start_time,
        "end_time": row.end_time,
        "job_files": files,
        "downloaded": True,  # the outputs are in the member's workspace already
        "url": f"{base_url}api/gpuhub/jobs/{row.id}",
        "user": row.user,
        "server_name": row.server_name,
        "output_dir": row.output_dir,
        "outputs": dict(row.outputs),
        "input_path": row.input_path,
        "exit_code": row.exit_code,
    }


class JobsBase(APIHandler):
    """What the endpoints share: the scope and its filter, the body, the row."""

    def allowed_users(self) -> set[str] | None:
        """The members whose jobs this request may see and act on: None for all.
        Raises 403 without the scope (:func:`hub_ext.common.member_scope.allowed_users`)."""
        return allowed_users(self, JOBS_SCOPE, "notebook jobs")

    def member(self):
        """The member a new one is made for: the request's own user."""
        return own_member(
            self,
            JOBS_SCOPE,
            "notebook jobs",
            "Only a member (or their server) creates their own jobs.",
        )

    def body(self):
        return json_body(
            self, MAX_BODY_BYTES, "a job", "Jupyter Scheduler's CreateJob as a JSON object"
        )

    def row_or_404(self, job_id: str) -> store.JobRow:
        allowed = self.allowed_users()
        row = store.get(self.db, job_id)
        if row is None or (allowed is not None and row.user not in allowed):
            raise web.HTTPError(404, f"No job {job_id}.")
        return row

    def owner(self, row):
        orm_user = orm.User.find(self.db, row.user)
        if orm_user is None:
            raise web.HTTPError(404, f"No job {row.id}.")
        return self.users[orm_user]

    def reply(self, status: int, payload=None) -> None:
        reply(self, status, payload)

    @property
    def jobs(self) -> lifecycle.Jobs:
        return lifecycle.jobs_of(self.settings)


class JobsAPIHandler(JobsBase):
    """``GET|POST /hub/api/gpuhub/jobs``."""

    async def get(self):
        allowed = self.allowed_users()
        self.jobs  # noqa: B018 - the keeper runs once a request came
        who = self.get_argument("user", None)
        if who is not None and allowed is not None and who not in allowed:
            raise web.HTTPError(403, "You may list your own jobs only.")
        statuses = tuple(s for s in self.get_arguments("status") if s in store.STATUSES) or None
        rows = [
            r
            for r in store.load(self.db, who, statuses, self.get_argument("name", None))
            if allowed is None or r.user in allowed
        ]
        try:
            start = int(self.get_argument("next_token", "0") or 0)
            size = int(self.get_argument("max_items", str(MAX_ITEMS)) or MAX_ITEMS)
        except ValueError:
            raise web.HTTPError(400, "next_token and max_items are whole numbers.") from None
        size = max(1, min(size, MAX_ITEMS))
        page = rows[start : start + size]
        more = start + size < len(rows)
        self.reply(
            200,
            {
                "jobs": [model(r, self.hub.base_url) for r in page],
                "total_count": len(rows),
                "next_token": str(start + size) if more else None,
            },
        )

    async def post(self):
        user = self.member()
        try:
            async with self.jobs.turns.turn(user.name):  # one of hers at a time: intake
                row = await lifecycle.create(self.jobs, user, self.body())
        except JobRefused as e:
            self.log.info("Job of %s refused (%s): %s", user.name, e.status, e.message)
            raise web.HTTPError(e.status, e.message) from None
        self.set_header("Location", f"{self.hub.base_url}api/gpuhub/jobs/{row.id}")
        self.reply(201, {"job_id": row.id})


#: a profile's name that says its GPUs already: "PyTorch, 1 GPU", "Two A100 GPUs"
SAYS_GPUS = re.compile(
    r"\b(\d+|an?|one|two|three|four|five|six|seven|eight)\s+(\S+\s+)?GPUs?\b", re.IGNORECASE
)


def environment_label(name: str, gpus: str, price: float, free: int, total: int) -> str:
    """An environment as the Scheduler's form lists it: "PyTorch, 1 GPU, 1.00 credits/h,
    1 of 2 free" (``name`` the profile's display name, ``gpus`` its GPUs in words, ``price``
    credits per hour); the GPUs are left out when the name says them already ("PyTorch,
    1 GPU" is not followed by "1 GPU" again)."""
    parts = [name] if SAYS_GPUS.search(name) else [name, gpus]
    return ", ".join([*parts, f"{price:.2f} credits/h", f"{free} of {total} free"])


def place_message(position: int, sentence: str, estimate_s: float | None) -> str:
    """A queued job's place as one line: "Waiting for a GPU: 2nd in line, about 5 min";
    without an estimate in seconds the line's ``sentence`` follows."""
    line = f"Waiting for a GPU: {ordinal(position)} in line"
    if isinstance(estimate_s, int | float):
        return f"{line}, {minutes(estimate_s)}"
    return f"{line}. {sentence}" if sentence else line


class JobAPIHandler(JobsBase):
    """``GET|DELETE /hub/api/gpuhub/jobs/<id>``."""

    async def get(self, job_id: str):
        row = self.row_or_404(job_id)
        payload = model(row, self.hub.base_url)
        if row.status == "QUEUED":
            payload["place"] = self.place(row)
        self.reply(200, payload)

    def place(self, row) -> dict:
        """The job's place in the line: ``position`` (1: next), ``ahead``, ``estimate`` (the
        line's sentence), ``estimate_s`` (seconds or None) and ``message`` (the one line
        the Scheduler's job detail shows: :func:`place_message`)."""
        line = lifecycle.the_line(self.db)
        key = next(
            (p.key for p in line.ordered() if tuple(p.key) == (row.user, row.server_name)), None
        )
        if key is None:
            sentence = (
                "It starts once your job or server before it on the same environment has its GPU."
                if lifecycle.start_blocked(self.owner(row), row)
                else "Starting."
            )
            return {"position": None, "ahead": None, "estimate": sentence, "message": sentence}
        described = line.describe(key)
        position, estimate_s = described["position"], described["estimate_s"]
        return {
            "position": position,
            "ahead": position - 1,
            "estimate": described["sentence"],
            "estimate_s": estimate_s,
            "message": place_message(position, described["sentence"], estimate_s),
        }

    async def delete(self, job_id: str):
        row = self.row_or_404(job_id)
        user = self.owner(row)
        await lifecycle.stop(user, row, f"Deleted by {self.current_user.name}.")
        row = store.get(self.db, job_id)
        if row is not None:  # a start still ending finds no row and leaves nothing
            store.delete(self.db, row)
        self.log.info("%s deleted job %s of %s", self.current_user.name, job_id, user.name)
        self.reply(204)


class JobStopAPIHandler(JobsBase):
    """``POST /hub/api/gpuhub/jobs/<id>/stop``."""

    async def post(self, job_id: str):
        row = self.row_or_404(job_id)
        user = self.owner(row)
        who = self.current_user.name
        why = "Stopped by you." if who == row.user else f"Stopped by {who}."
        await lifecycle.stop(user, row, why)
        self.log.info("%s stopped job %s of %s", who, job_id, row.user)
        self.reply(204)


class JobReportAPIHandler(JobsBase):
    """``POST /hub/api/gpuhub/jobs/<id>/report``: from the job's own server token."""

    def from_job_server(self, row) -> bool:
        """Whether the request's token is the one JupyterHub made for the job's server at
        its start (``row.server_token_id``, kept by :class:`hub_ext.jobs.hook.JobsHook`):
        not another token of the member's, whatever its note or scopes (she may make
        tokens with any scope she holds, the server's among them)."""
        token = self.get_auth_token()
        orm_token = orm.APIToken.find(self.db, token) if token else None
        return (
            orm_token is not None
            and row.server_token_id is not None
            and orm_token.id == row.server_token_id
        )

    async def post(self, job_id: str):
        row = self.row_or_404(job_id)
        user = self.owner(row)
        if not self.from_job_server(row):
            raise web.HTTPError(403, "Only the job's own server reports its end.")
        body = self.body()
        if not isinstance(body, dict) or not isinstance(body.get("exit_code"), int):
            raise web.HTTPError(400, 'The report is {"exit_code": <int>, "error": "<line>"}.')
        error = str(body.get("error") or "")[: store.MESSAGE_CHARS]
        if row.status in store.ACTIVE and row.reported is None:
            row.reported = {"exit_code": body["exit_code"], "error": error}
            self.db.commit()
            self.log.info("Job %s of %s reported exit code %s", job_id, row.user, body["exit_code"])
        active = row.server_name in user.spawners and user.spawners[row.server_name].active
        if active:
            # before the answer: a runner that exits once answered (Slurm) is then expected
            user.spawners[row.server_name].job_reported = True
        self.reply(204)
        if active:
            await lifecycle.stop_server(user, row.server_name)


class EnvironmentsAPIHandler(JobsBase):
    """``GET /hub/api/gpuhub/jobs/environments``: Jupyter Scheduler's
    ``RuntimeEnvironment`` list, the profiles open to the member that run jobs."""

    async def get(self):
        user = self.member()
        spawner = user.spawner
        visible, _ = await spawner.get_profiles()
        snapshot = await spawner.gpu_snapshot()
        environments = []
        for profile in visible:
            if not jobs_allowed(profile):
                continue
            overrides = profile_overrides(Selection(profile))
            gpus = spawner.gpus_now(snapshot, overrides)
            price = float(overrides.get("credits_per_hour", 0) or 0)
            unit = f"{gpus.kind} GPU slice" if gpus.mig else "GPU"
            label = environment_label(
                profile.get("display_name", profile["slug"]),
                f"{gpus.count} {unit}{'s' if gpus.count != 1 else ''}",
                price,
                gpus.free,
                gpus.total,
            )
            environments.append(
                {
                    "name": profile["slug"],
                    "label": label,
                    "description": profile.get("description", ""),
                    "file_extensions": ["ipynb"],
                    "output_formats": list(OUTPUT_FORMATS),
                    "metadata": {
                        "gpus": gpus.count,
                        "credits_per_hour": price,
                        "free_gpus": gpus.free,
                        "total_gpus": gpus.total,
                        "max_seconds": job_max_seconds(profile),
                    },
                    "compute_types": None,
                    "default_compute_type": None,
                    "utc_only": True,
                }
            )
        self.reply(200, {"environments": environments})


handlers = [
    (r"/api/gpuhub/jobs", JobsAPIHandler),
    (r"/api/gpuhub/jobs/environments", EnvironmentsAPIHandler),
    (rf"/api/gpuhub/jobs/({JOB_ID})", JobAPIHandler),
    (rf"/api/gpuhub/jobs/({JOB_ID})/stop", JobStopAPIHandler),
    (rf"/api/gpuhub/jobs/({JOB_ID})/report", JobReportAPIHandler),
]
