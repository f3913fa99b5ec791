"""Jupyter Scheduler in the image sends a member's notebook jobs to the hub (gpuhub_scheduler).

A contract test of the plugin, not of the hub: the image's real jupyterhub-singleuser, with
Jupyter Scheduler and ``gpuhub_scheduler`` as built, talks to :class:`JobsHub`, a small real
HTTP server started here that answers the hub's documented jobs endpoints
(docs/howto/notebook-jobs.md; ``/hub/api/gpuhub/jobs...``) with canned jobs and records every
request. The member's side is driven through the Scheduler's own REST API
(``/user/alice/scheduler/...``), which is what the JupyterLab extension calls. The hub's real
endpoints are tested with a real hub in ``tests/test_notebook_jobs_member_hub.py``.
"""

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.images.conftest import HubThatKnowsOnlyAlice, alice_route, singleuser_server

pytestmark = pytest.mark.docker

SERVER_TOKEN = "server-api-token"  # what alice_server gives its server as JUPYTERHUB_API_TOKEN
PYTORCH = {
    "name": "pytorch",
    "label": "PyTorch, 1 GPU, 1.00 credits/h, 1 of 2 free",
    "description": "PyTorch on one GPU",
    "file_extensions": ["ipynb"],
    "output_formats": ["ipynb", "html"],
    "metadata": {"gpus": 1, "credits_per_hour": 1.0, "free_gpus": 1, "total_gpus": 2},
}
NO_CREDITS = "You have 0.20 credits; PyTorch needs 1.00 for its first interval."


class JobsHub:
    """The hub's REST API as far as a member's server uses it: ``GET /hub/api`` (version),
    ``GET /hub/api/user`` (alice for ``ALICE_TOKEN``), and the jobs endpoints for the
    server's own token. A create for ``runtime_environment_name == "broke"`` is refused with
    402 and :data:`NO_CREDITS`; created jobs are QUEUED 2nd in line until a test changes them."""

    ALICE_TOKEN = HubThatKnowsOnlyAlice.ALICE_TOKEN
    ALICE = HubThatKnowsOnlyAlice.ALICE

    def __init__(self, version):
        self.requests = []  # (method, path, body or None, Authorization header)
        self.jobs = {}
        self.environments = [PYTORCH]  # what GET .../environments lists
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hub.answer(self, "GET")

            def do_POST(self):
                hub.answer(self, "POST")

            def do_DELETE(self):
                hub.answer(self, "DELETE")

            def log_message(self, *args):
                pass

        self.version = version
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_url = f"http://127.0.0.1:{self.server.server_address[1]}/hub/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def jobs_requests(self):
        return [r for r in self.requests if r[1].startswith("/hub/api/gpuhub/")]

    def answer(self, handler, method):
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        auth = handler.headers.get("Authorization")
        path = handler.path
        self.requests.append((method, path, body, auth))
        status, reply = self.route(method, path.split("?")[0], body, auth)
        data = b"" if reply is None else json.dumps(reply).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("X-JupyterHub-Version", self.version)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def route(self, method, path, body, auth):
        if not path.startswith("/hub/api/gpuhub/jobs"):
            return alice_route(path, auth, self.version)
        if auth != f"token {SERVER_TOKEN}":
            return 403, {"status": 403, "message": "not alice's server"}
        rest = path[len("/hub/api/gpuhub/jobs") :].strip("/")
        if method == "GET" and rest == "environments":
            return 200, {"environments": self.environments}
        if method == "POST" and rest == "":
            return self.create(body)
        if method == "GET" and rest == "":
            jobs = [self.described(j) for j in self.jobs.values()]
            return 200, {"jobs": jobs, "total_count": len(jobs)}
        job_id, _, action = rest.partition("/")
        if job_id not in self.jobs:
            return 404, {"status": 404, "message": f"No such job: {job_id}"}
        if method == "GET" and not action:
            return 200, self.described(self.jobs[job_id])
        if method == "POST" and action == "stop":
            self.jobs[job_id]["status"] = "STOPPED"
            return 204, None
        if method == "DELETE" and not action:
            del self.jobs[job_id]
            return 204, None
        return 405, {"status": 405, "message": "no such action"}

    def create(self, body):
        if body["runtime_environment_name"] == "broke":
            return 402, {"status": 402, "message": NO_CREDITS}
        job_id = str(uuid.uuid4())
        stem = body["input_uri"].rsplit("/", 1)[-1].removesuffix(".ipynb")
        output_dir = f"jobs/{stem}-{job_id}"
        outputs = {
            fmt: f"{output_dir}/{stem}-2026-11-26-01-30-00-PM.{fmt}"
            for fmt in body["output_formats"]
        }
        outputs["log"] = f"{output_dir}/{stem}-2026-11-26-01-30-00-PM.log"
        self.jobs[job_id] = {
            "job_id": job_id,
            "name": body["name"],
            "input_filename": f"{stem}.ipynb",
            "runtime_environment_name": body["runtime_environment_name"],
            "parameters": body["parameters"],
            "output_formats": body["output_formats"],
            "status": "QUEUED",
            "create_time": 1795008600000,
            "update_time": 1795008600000,
            "output_dir": output_dir,
            "outputs": outputs,
            "input_path": f"{output_dir}/input/{stem}.ipynb",
            "url": f"/hub/api/gpuhub/jobs/{job_id}",
            "downloaded": True,  # the hub's word; the server looks for the files itself
        }
        return 201, {"job_id": job_id}

    def described(self, job):
        described = dict(job)
        if job["status"] == "QUEUED":
            described["place"] = {
                "position": 2,
                "ahead": 1,
                "estimate": "You are 2nd in line for 1 GPU (PyTorch). Estimated wait: about 5 "
                "min. Your place is kept for about 58 min more.",
                "estimate_s": 290,
                "message": "Waiting for a GPU: 2nd in line, about 5 min",
            }
        return described


@pytest.fixture
def alice_hub(hub_version):
    """Replaces conftest's stand-in: ``alice_server`` starts its server against this one."""
    hub = JobsHub(hub_version)
    yield hub
    hub.close()


@pytest.fixture
def scheduler(alice_server, alice_hub):
    """An httpx client on alice's server's Scheduler API, as alice."""
    with httpx.Client(
        base_url=f"{alice_server.url}/scheduler",
        headers={"Authorization": f"token {alice_hub.ALICE_TOKEN}"},
        timeout=30,
    ) as client:
        yield client


def create(scheduler, input_uri="work/train.ipynb", environment="pytorch", **extra):
    return scheduler.post(
        "/jobs",
        json={
            "name": "train",
            "input_uri": input_uri,
            "runtime_environment_name": environment,
            "output_formats": ["ipynb", "html"],
            "parameters": {"epochs": "3"},
            **extra,
        },
    )


def test_every_image_offers_create_job_in_jupyterlab(image):
    # Jupyter Scheduler's lab extension (the file browser's and the notebook's "Create Job")
    # and its server extension, configured with the hub's scheduler
    lab = re.sub(r"\x1b\[[0-9;]*m", "", image.exec("sh", "-c", "jupyter labextension list 2>&1"))
    assert re.search(r"^\s*@jupyterlab/scheduler v2\.12\.\d+ enabled OK$", lab, re.M), lab
    server = re.sub(
        r"\x1b\[[0-9;]*m", "", image.exec("sh", "-c", "jupyter server extension list 2>&1")
    )
    assert re.search(r"^\s*jupyter_scheduler enabled$", server, re.M), server
    config = image.exec("sh", "-c", "jupyter server --show-config 2>/dev/null")
    assert "scheduler_class = 'gpuhub_scheduler.HubScheduler'" in config, config
    assert "environment_manager_class = 'gpuhub_scheduler.HubEnvironments'" in config, config


def test_environment_list_shows_the_hubs_job_profiles_with_price_and_free_gpus(scheduler):
    response = scheduler.get("/runtime_environments")
    assert response.status_code == 200, response.text
    [pytorch] = response.json()
    # the form lists an environment by its name and sends back its label: both the label
    assert pytorch["name"] == pytorch["label"] == "PyTorch, 1 GPU, 1.00 credits/h, 1 of 2 free"
    assert pytorch["metadata"]["profile"] == "pytorch"
    assert pytorch["output_formats"] == [
        {"name": "ipynb", "label": "Notebook"},
        {"name": "html", "label": "HTML"},
    ]
    # the hub's only job environment: the form shows no Environment list, but it shows the
    # environment's one "Compute type", the label (issue 28)
    assert pytorch["compute_types"] == [pytorch["label"]]
    assert pytorch["default_compute_type"] == pytorch["label"]


def test_with_several_environments_the_list_alone_shows_each_label(scheduler, alice_hub):
    python = {
        **PYTORCH,
        "name": "python-gpu",
        "label": "Python, 1 GPU, 0.50 credits/h, 2 of 2 free",
    }
    alice_hub.environments = [PYTORCH, python]
    response = scheduler.get("/runtime_environments")
    assert response.status_code == 200, response.text
    assert [(e["name"], e["compute_types"]) for e in response.json()] == [
        (PYTORCH["label"], None),
        (python["label"], None),
    ]


def test_created_job_reaches_the_hub_with_the_servers_token_and_shows_its_place(
    scheduler, alice_hub
):
    response = create(scheduler)
    assert response.status_code == 200, response.text
    job_id = response.json()["job_id"]
    [(method, path, body, auth)] = [r for r in alice_hub.jobs_requests() if r[0] == "POST"]
    assert (method, path, auth) == ("POST", "/hub/api/gpuhub/jobs", f"token {SERVER_TOKEN}")
    assert body["input_uri"] == "train.ipynb"  # workspace-relative: work/ is the workspace
    assert body["parameters"] == {"epochs": "3"}
    assert body["runtime_environment_name"] == "pytorch"

    job = scheduler.get(f"/jobs/{job_id}").json()
    assert job["status"] == "QUEUED"
    assert job["status_message"] == "Waiting for a GPU: 2nd in line, about 5 min"
    listed = scheduler.get("/jobs").json()
    assert [j["job_id"] for j in listed["jobs"]] == [job_id]
    assert scheduler.get("/jobs/count", params={"status": "QUEUED"}).json() == {"count": 1}

    # what the Create Job form sends: the label of an environment it listed; the hub its slug
    scheduler.get("/runtime_environments")
    assert create(scheduler, environment=PYTORCH["label"]).status_code == 200
    posted = [r[2] for r in alice_hub.jobs_requests() if r[0] == "POST"]
    assert posted[-1]["runtime_environment_name"] == "pytorch"


def test_hubs_refusal_reaches_the_create_form_in_its_own_words(scheduler, alice_hub):
    response = create(scheduler, environment="broke")
    # Jupyter Scheduler answers every SchedulerError with 500; its form shows "message"
    assert response.status_code == 500
    assert response.json()["message"] == NO_CREDITS


def test_notebook_outside_the_workspace_is_refused_before_the_hub_is_asked(scheduler, alice_hub):
    response = create(scheduler, input_uri="notes/train.ipynb")
    assert response.status_code == 500
    assert re.match(
        r"Only notebooks in your workspace \(work/\) can run as jobs", response.json()["message"]
    )
    assert not [r for r in alice_hub.jobs_requests() if r[0] == "POST"]


def test_finished_jobs_files_are_found_in_the_workspace_without_a_download(
    scheduler, alice_hub, alice_server
):
    job_id = create(scheduler).json()["job_id"]
    job = alice_hub.jobs[job_id]
    job["status"] = "COMPLETED"
    before = scheduler.get(f"/jobs/{job_id}").json()
    assert before["downloaded"] is False
    assert all(f["file_path"] is None for f in before["job_files"])

    # the job (the hub's container) writes its outputs and the input copy into the workspace
    files = [*job["outputs"].values(), job["input_path"]]
    alice_server.container.exec_run(
        [
            "sh",
            "-c",
            'cd /home/jovyan/work && for f in "$@"; do '
            'mkdir -p "$(dirname "$f")"; echo {} > "$f"; done',
            "sh",
            *files,
        ]
    )
    after = scheduler.get(f"/jobs/{job_id}").json()
    shown = {f["file_format"]: f["file_path"] for f in after["job_files"]}
    assert shown == {
        "ipynb": f"work/{job['outputs']['ipynb']}",
        "html": f"work/{job['outputs']['html']}",
        "log": f"work/{job['outputs']['log']}",
        "input": f"work/{job['output_dir']}/input/train.ipynb",
    }
    assert after["downloaded"] is True
    assert "status_message" not in after or not after["status_message"]


def test_stop_and_delete_in_the_scheduler_reach_the_hub(scheduler, alice_hub):
    job_id = create(scheduler).json()["job_id"]
    assert scheduler.patch(f"/jobs/{job_id}", json={"status": "STOPPED"}).status_code == 204
    assert alice_hub.jobs[job_id]["status"] == "STOPPED"
    assert scheduler.delete(f"/jobs/{job_id}").status_code == 204
    assert job_id not in alice_hub.jobs
    calls = [(m, p) for m, p, _, _ in alice_hub.jobs_requests() if m != "GET"]
    assert calls[1:] == [
        ("POST", f"/hub/api/gpuhub/jobs/{job_id}/stop"),
        ("DELETE", f"/hub/api/gpuhub/jobs/{job_id}"),
    ]


def test_another_members_job_is_not_found_in_the_hubs_words(scheduler):
    response = scheduler.get(f"/jobs/{uuid.uuid4()}")
    assert response.status_code == 500
    assert response.json()["message"].startswith("No such job: ")


def test_scheduled_jobs_are_refused_in_words_and_none_are_listed(scheduler):
    listed = scheduler.get("/job_definitions")
    assert listed.status_code == 200, listed.text
    assert listed.json()["job_definitions"] == []
    response = scheduler.post(
        "/job_definitions",
        json={
            "name": "nightly",
            "input_uri": "work/train.ipynb",
            "runtime_environment_name": "pytorch",
            "schedule": "0 0 * * *",
        },
    )
    assert response.status_code == 500
    assert response.json()["message"].startswith("Scheduled jobs (job definitions) are not offered")


def test_form_offers_parameters_and_stop_but_not_schedules(scheduler):
    features = scheduler.get("/config").json()["supported_features"]
    assert features["parameters"] and features["stop_job"] and features["output_formats"]
    assert not features["job_definition"]


def test_server_starts_with_a_home_it_cannot_write_and_writes_no_scheduler_database(
    engine, base_image, alice_hub
):
    # Jupyter Scheduler makes its SQLite tables at every start (in HOME by default); the image
    # keeps them in memory, so a member's own uid with a HOME it cannot write still gets a
    # server (the server's own runtime files need a folder it can write: JUPYTER_RUNTIME_DIR)
    with singleuser_server(
        engine,
        base_image.name,
        alice_hub.api_url,
        user="4242:100",
        environment={"HOME": "/usr/share", "JUPYTER_RUNTIME_DIR": "/tmp/alice-runtime"},
    ) as server:
        logs = server.logs()
        assert "jupyter_scheduler | extension was successfully loaded" in logs, logs
        alice = {"Authorization": f"token {alice_hub.ALICE_TOKEN}"}
        listed = httpx.get(f"{server.url}/scheduler/runtime_environments", headers=alice)
        assert listed.status_code == 200, (listed.text, server.logs())
        found = server.container.exec_run(
            ["find", "/", "-xdev", "-name", "scheduler.sqlite*"], user="root"
        )
        assert found.output.decode() == ""


OWN_SCHEDULER = """
import sys, tempfile
import jupyter_scheduler.extension, jupyter_scheduler.scheduler as scheduler
print("sqlalchemy" in sys.modules)
from jupyter_scheduler.environments import CondaEnvironmentManager
from jupyter_scheduler.models import CountJobsQuery, Status
from jupyter_scheduler.orm import Job, create_tables
folder = tempfile.mkdtemp()
url = f"sqlite:///{folder}/scheduler.sqlite"
create_tables(url)
own = scheduler.Scheduler(
    root_dir=folder, environments_manager=CondaEnvironmentManager(), db_url=url,
    task_runner_class=None,
)
with own.db_session() as session:
    session.add(Job(name="a", input_filename="a.ipynb", runtime_environment_name="x"))
    session.commit()
print(own.count_jobs(CountJobsQuery(status=Status.STOPPED)))  # a new row is STOPPED (the ORM)
"""


def test_jupyter_schedulers_own_scheduler_still_keeps_its_jobs(base_image):
    # gpuhub-lazy-imports defers SQLAlchemy in jupyter_scheduler (a server start imports none);
    # a site that configures Jupyter Scheduler's own Scheduler still gets its database
    assert base_image.python(OWN_SCHEDULER).splitlines() == ["False", "1"]
