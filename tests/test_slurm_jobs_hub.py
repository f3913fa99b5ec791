"""GPU notebook jobs on the Slurm backend: a real hub and proxy, the two-node test cluster
(tests/fixtures/slurm.py) with slurmdbd, the reference Credits service.  A job is a Slurm
batch job of the member's, in the same bubblewrap container as a server, running
``gpuhub-notebook-job`` behind batchspawner's wrapper.  The "gpu" profile costs 4 credits
per hour: 1.00 per 15-minute interval."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from hub_ext.slurm.cluster import SlurmCluster
from tests.fixtures.hub import _need, eventually
from tests.test_credits_hub import grant, ledger
from tests.test_jobs_hub import JOBS, ended, job, notebook, status_is
from tests.test_slurm_faults import hold_every_gpu
from tests.test_slurm_pages import hub_runs

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
]
#: the hub sees a Slurm job that ended behind its back at its next poll of the server
QUICK = (
    "c.GPUSlurmSpawner.poll_interval = 1\n"
    "c.CreditsHook.meter_period = 0.5\n"
    "c.Jobs.check_interval = 0.5\n"
)

#: prints the GPU the job sees (node, Slurm's GPU index, CUDA's, the device files in the
#: container) and a value computed from a papermill parameter
GPU_NOTEBOOK = notebook(
    "import os\n"
    "seen = [os.environ.get(k, '') for k in "
    "('SLURMD_NODENAME', 'SLURM_JOB_GPUS', 'CUDA_VISIBLE_DEVICES')]\n"
    "devices = ','.join(sorted(d for d in os.listdir('/dev') if d.startswith('nvidia')))\n"
    "print(f'GPU seen: {\":\".join(seen)}:{devices}:END')",
    "print('squared:', int(n) ** 2)",
    parameters='n = "2"',
)
SEEN = re.compile(r"GPU seen: (\w+):(\d+):(\d*):([\w,]*):END")


@pytest.fixture
def jobs_hub(slurm_hub, credits_service):
    async def make(profiles=PROFILES):
        return await slurm_hub(
            profiles,
            extra_config=QUICK,
            GPUHUB_CREDITS_URL=credits_service.url,
            GPUHUB_CREDITS_TOKEN=credits_service.hub_token,
        )

    return make


@pytest.fixture
async def admin(credits_service):
    async with credits_service.client(admin=True) as client:
        yield client


def workspace(cluster, name: str, files: dict[str, str]) -> Path:
    """``name``'s workspace on the cluster's shared storage, hers (0700), with ``files``."""
    entry = pwd.getpwnam(name)
    path = cluster.shared / "home" / name
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    for filename, text in files.items():
        (path / filename).write_text(text)
        os.chown(path / filename, entry.pw_uid, entry.pw_gid)
    return path


async def create(hub, token, path: str, **body) -> str:
    r = await hub.api(
        "POST",
        JOBS,
        token,
        json={"input_uri": path, "runtime_environment_name": "gpu", **body},
    )
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


async def settled(admin, member) -> list[tuple[str, str]]:
    """The member's ledger once it holds a grant, a debit and a refund."""

    async def three():
        got = await ledger(admin, member)
        return got if len(got) == 3 else None

    return await eventually(three, 30, f"{member}'s debit and refund")


def refund_of_a_short_run(entries) -> None:
    """10.00 granted, one interval paid (1.00), most of it given back."""
    assert [kind for kind, _ in entries] == ["grant", "debit", "refund"], entries
    assert entries[1] == ("debit", "1.00"), entries
    assert Decimal("0.80") <= Decimal(entries[2][1]) <= Decimal("1.00"), entries


async def test_a_notebook_job_runs_on_its_slurm_gpu_is_accounted_and_settled(
    jobs_hub, slurm_cluster, admin
):
    member = slurm_cluster.fresh_member("ghs-job")
    mine = workspace(slurm_cluster, member, {"train.ipynb": GPU_NOTEBOOK})
    hub = await jobs_hub()
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")

    # every GPU of the cluster held by plain jobs: the notebook job waits in Slurm's
    # queue, which is its place in the hub's line, and costs nothing while it waits
    holds = hold_every_gpu(slurm_cluster, slurm_cluster.fresh_member("ghs-hold"))
    job_id = await create(hub, token, "train.ipynb", parameters={"n": "7"})

    async def placed():
        model = await job(hub, token, job_id)
        return model if model.get("place", {}).get("position") else None

    waiting = await eventually(placed, 60, "the job's place in line")
    assert (waiting["status"], waiting["place"]["position"]) == ("QUEUED", 1), waiting
    assert await ledger(admin, member) == [("grant", "10.00")]

    # one GPU freed: the job takes it, runs, is COMPLETED
    [freed] = await SlurmCluster(env=slurm_cluster.env).job_gpus(holds[0])
    slurm_cluster.run("scancel", holds[0])
    done = await ended(hub, token, job_id, 240)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done

    # the output notebook in her workspace holds the GPU the job saw and the value
    executed = (mine / done["outputs"]["ipynb"]).read_text()
    node, gpu, cuda, devices = SEEN.findall(executed)[-1]
    assert {node: [int(gpu)]} == freed.gpus, executed  # the GPU that was freed
    assert (cuda, devices) == ("0", f"nvidia{gpu}")  # that GPU alone, as CUDA numbers it
    assert "squared: 49" in executed
    assert (mine / done["outputs"]["ipynb"]).stat().st_uid == pwd.getpwnam(member).pw_uid

    # the hub's run record and Slurm's own records name the same job and GPU
    [run] = [r for r in hub_runs(hub) if r.username == member]
    assert (run.server_name, run.devices) == (done["server_name"], [f"{node}/gpu{gpu}"])
    assert run.stopped_at is not None
    slurm_job = run.job_id
    # the GPU is free as soon as the job is COMPLETED: Slurm's job is over
    assert slurm_cluster.job_state(slurm_job) not in ("PENDING", "RUNNING")
    holders = await SlurmCluster(env=slurm_cluster.env).job_gpus()
    assert not [j for j in holders if int(gpu) in j.gpus.get(node, [])], holders
    if slurm_cluster.accounting:

        def accounted():
            out = slurm_cluster.run(
                "sacct", "-a", "-X", "-n", "-P", "-j", slurm_job, "-o", "JobName,User,AllocTRES"
            ).stdout.split("\n")[0]
            return out.split("|") if out else None

        name, user, tres = slurm_cluster.wait_for("sacct to know the job", accounted)
        assert (name, user) == (f"gpuhub-notebook-{member}-{done['server_name']}", member)
        assert "gres/gpu=1" in tres
        # the batch job ended by itself once the hub had the report: not cancelled
        assert accounted_end(slurm_cluster, slurm_job) == ("COMPLETED", "0:0")
    assert run.stop_reason == "job_ended" and run.stop_detail is None, run

    refund_of_a_short_run(await settled(admin, member))
    assert (await hub.api("GET", f"/users/{member}")).json()["servers"] == {}
    for held in holds[1:]:
        slurm_cluster.run("scancel", held)


async def test_a_jobs_slurm_job_cancelled_outside_the_hub_fails_with_why_and_is_refunded(
    jobs_hub, slurm_cluster, admin
):
    member = slurm_cluster.fresh_member("ghs-job")
    workspace(slurm_cluster, member, {"slow.ipynb": notebook("import time\ntime.sleep(600)")})
    hub = await jobs_hub()
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")

    job_id = await create(hub, token, "slow.ipynb")
    running = await status_is(hub, token, job_id, "IN_PROGRESS", 240)
    [line] = slurm_cluster.run("squeue", "-h", "-u", member, "-o", "%i|%j|%l").stdout.split()
    slurm_job, name, limit = line.split("|")
    assert name == f"gpuhub-notebook-{member}-{running['server_name']}"
    assert limit == "1-00:01:00"  # the profile's job_max_seconds (default 1 day) + 1 min

    slurm_cluster.run("scancel", slurm_job)  # an admin, outside the hub
    failed = await ended(hub, token, job_id, 60)
    assert (failed["status"], failed["status_message"]) == (
        "FAILED",
        f"The job ended without a report: Slurm job {slurm_job} was cancelled outside the hub.",
    ), failed
    refund_of_a_short_run(await settled(admin, member))
    [run] = [r for r in hub_runs(hub) if r.username == member]
    assert (run.job_id, run.stop_reason) == (slurm_job, "job_ended")


@pytest.fixture
def image_without_runner(slurm_cluster, slurm_image):
    """The test image unpacked again (hard links) as ``gpuhub-test/norunner:old``, without
    gpuhub-notebook-job: an image built before notebook jobs."""
    images = slurm_cluster.dir / "images"
    old = images / "gpuhub-test_norunner_old"
    shutil.rmtree(old, ignore_errors=True)
    old.mkdir()
    source = images / slurm_image.replace("/", "_").replace(":", "_") / "rootfs"
    subprocess.run(["cp", "-al", str(source), str(old / "rootfs")], check=True)
    (old / "rootfs" / "usr" / "local" / "bin" / "gpuhub-notebook-job").unlink()
    yield "gpuhub-test/norunner:old"
    shutil.rmtree(old, ignore_errors=True)


async def test_a_job_on_an_image_without_the_runner_fails_at_once_and_costs_nothing(
    jobs_hub, slurm_cluster, admin, image_without_runner
):
    member = slurm_cluster.fresh_member("ghs-job")
    workspace(slurm_cluster, member, {"train.ipynb": GPU_NOTEBOOK})
    old = {**PROFILES[1], "spawner_override": {"image": image_without_runner}}
    hub = await jobs_hub([PROFILES[0], old])
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")

    failed = await ended(hub, token, await create(hub, token, "train.ipynb"), 30)
    assert (failed["status"], failed["status_message"]) == (
        "FAILED",
        f"It could not start: The image {image_without_runner} on the cluster cannot run "
        "notebook jobs (it has no gpuhub-notebook-job). Ask an admin to rebuild it and "
        "unpack it again.",
    ), failed
    assert slurm_cluster.run("squeue", "-h", "-u", member).stdout == ""  # never submitted
    assert await ledger(admin, member) == [("grant", "10.00")]


async def test_a_profile_no_node_can_hold_is_refused_in_words_as_a_server_and_a_job(
    jobs_hub, slurm_cluster, admin
):
    """sbatch refuses a job that asks more memory than any node has ("Memory specification
    can not be satisfied"): the member reads what does not fit, never a 500."""
    member = slurm_cluster.fresh_member("ghs-job")
    workspace(slurm_cluster, member, {"train.ipynb": GPU_NOTEBOOK})
    big = {**PROFILES[1], "display_name": "Huge GPU", "spawner_override": {"mem_limit": "4096G"}}
    hub = await jobs_hub([PROFILES[0], big])
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")
    words = re.compile(
        r"Huge GPU cannot start on this cluster: it asks for 4096 GB of memory \(at most "
        r"[\d.]+ GB on the nodes of partition gpu\)\. Ask an admin to fix the profile\."
    )

    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code == 503, r.text
    assert words.fullmatch(r.json()["message"]), r.json()
    assert "Memory specification can not be satisfied" in hub.log()  # Slurm's, for admins

    failed = await ended(hub, token, await create(hub, token, "train.ipynb"), 60)
    assert failed["status"] == "FAILED", failed
    assert words.fullmatch(failed["status_message"].removeprefix("It could not start: "))
    assert slurm_cluster.run("squeue", "-h", "-u", member).stdout == ""
    assert await ledger(admin, member) == [("grant", "10.00")]  # nothing paid


async def test_after_a_kill_9_a_running_job_and_a_waiting_one_each_end_once(
    jobs_hub, slurm_cluster, admin
):
    """The hub killed with one job running and one waiting in Slurm's queue: the running
    one reports to the restarted hub, the waiting one keeps its Slurm job and its place
    and runs when the GPU frees; each is debited and refunded once."""
    alice, bob = (slurm_cluster.fresh_member("ghs-job") for _ in range(2))
    mine = workspace(
        slurm_cluster,
        alice,
        {"long.ipynb": notebook("import time\ntime.sleep(20)\nprint('slept')")},
    )
    his = workspace(slurm_cluster, bob, {"train.ipynb": GPU_NOTEBOOK})
    hub = await jobs_hub()
    tokens = {name: await hub.create_user(name) for name in (alice, bob)}
    for name in (alice, bob):
        await grant(admin, name, "10.00")
    holds = hold_every_gpu(slurm_cluster, slurm_cluster.fresh_member("ghs-hold"), gpus=3)

    running = await create(hub, tokens[alice], "long.ipynb")
    await status_is(hub, tokens[alice], running, "IN_PROGRESS", 240)
    waiting = await create(hub, tokens[bob], "train.ipynb", parameters={"n": "3"})

    async def first_in_line():
        model = await job(hub, tokens[bob], waiting)
        return model.get("place", {}).get("position") == 1

    await eventually(first_in_line, 60, "bob's job first in line")
    [pending] = slurm_cluster.run("squeue", "-h", "-u", bob, "-o", "%i").stdout.split()

    hub.kill()  # SIGKILL: no clean-up at all
    await hub.start()
    await eventually(first_in_line, 60, "bob's place kept after the restart")
    assert (await job(hub, tokens[alice], running))["status"] == "IN_PROGRESS"

    done = await ended(hub, tokens[alice], running, 120)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    assert "slept" in (mine / done["outputs"]["ipynb"]).read_text()
    after = await ended(hub, tokens[bob], waiting, 180)
    assert (after["status"], after["exit_code"]) == ("COMPLETED", 0), after
    assert "squared: 9" in (his / after["outputs"]["ipynb"]).read_text()
    [run] = [r for r in hub_runs(hub) if r.username == bob]
    assert run.job_id == pending  # the same Slurm job, taken back by the restarted hub
    for name in (alice, bob):  # nothing charged twice
        refund_of_a_short_run(await settled(admin, name))
    await asyncio.sleep(2)  # a second settlement would come within the meter's period
    for name in (alice, bob):
        assert len(await ledger(admin, name)) == 3
    for held in holds:
        slurm_cluster.run("scancel", held)


async def test_a_job_through_the_submit_host_gets_its_job_and_its_token_there(
    slurm_hub, slurm_cluster, submit_host
):
    """Every Slurm command over ssh on the login host (the hub cannot reach the cluster
    itself: tests/test_slurm_submit_host.py): GPUHUB_JOB crosses ssh in the command's
    environment, and the job's API token, which never does, reaches the runner through
    its token file; the runner's report is accepted with it."""
    path = ":".join(p for p in os.environ["PATH"].split(":") if not p.endswith("sbin"))
    hub = await slurm_hub(
        PROFILES,
        extra_config=QUICK,
        GPUHUB_CREDITS="off",
        SLURM_CONF="/nonexistent/slurm.conf",
        PATH=path,
        **submit_host.settings,
    )
    member = slurm_cluster.fresh_member("ghl-job")
    mine = workspace(slurm_cluster, member, {"train.ipynb": GPU_NOTEBOOK})
    token = await hub.create_user(member)
    done = await ended(hub, token, await create(hub, token, "train.ipynb"), 240)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    assert "squared: 4" in (mine / done["outputs"]["ipynb"]).read_text()
    # COMPLETED within the time allowed: the runner's report was accepted (without it the
    # runner waits 10 min for the hub, GPUHUB_JOB_LINGER, before it exits)


@pytest.fixture
def taken_down(slurm_cluster):
    """Set a node DOWN as an admin does (``scontrol update ... state=down reason=...``); every
    node taken down is resumed at the test's end, so the shared cluster is left healthy
    (an admin's down lasts until they resume the node: ReturnToService=1)."""
    nodes = []

    def down(node: str) -> None:
        nodes.append(node)
        slurm_cluster.run(
            "scontrol", "update", f"nodename={node}", "state=down", "reason=gpuhub-test"
        )

    yield down
    for node in nodes:
        resume(slurm_cluster, node)


def resume(cluster, node: str) -> None:
    cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    cluster.wait_for(
        f"{node} to come back",
        lambda: (
            cluster.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip() in ("idle", "mixed")
        ),
    )


async def test_a_node_going_down_under_a_running_job_fails_it_once_with_why_and_refunds(
    jobs_hub, slurm_cluster, admin, taken_down
):
    """An admin sets the node of a member's running job DOWN: Slurm kills the batch job
    (NODE_FAIL) and, its script saying --no-requeue, never runs it again behind the hub;
    the member's job is FAILED naming the node and Slurm's reason, settled once, and her
    next job runs."""
    member = slurm_cluster.fresh_member("ghs-job")
    mine = workspace(
        slurm_cluster,
        member,
        {"slow.ipynb": notebook("import time\ntime.sleep(600)"), "train.ipynb": GPU_NOTEBOOK},
    )
    hub = await jobs_hub()
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")

    job_id = await create(hub, token, "slow.ipynb")
    await status_is(hub, token, job_id, "IN_PROGRESS", 240)
    [line] = slurm_cluster.run("squeue", "-h", "-u", member, "-o", "%i|%N").stdout.split()
    slurm_job, node = line.split("|")

    taken_down(node)
    failed = await ended(hub, token, job_id, 60)
    assert (failed["status"], failed["status_message"]) == (
        "FAILED",
        f"The job stopped because the node it ran on went down (node {node} down: "
        "gpuhub-test). It does not run again by itself: create the job again.",
    ), failed
    # Slurm ended the batch job for its node and keeps it ended: not requeued, so the
    # notebook is not run a second time once the node is back
    assert slurm_cluster.run(
        "squeue", "-h", "-j", slurm_job, "-t", "all", "-o", "%T"
    ).stdout.split() == ["NODE_FAIL"]
    assert slurm_cluster.run("squeue", "-h", "-u", member).stdout == ""  # no GPU held
    refund_of_a_short_run(await settled(admin, member))
    [run] = [r for r in hub_runs(hub) if r.username == member]
    assert (run.job_id, run.stop_reason, run.stop_detail) == (
        slurm_job,
        "node_down",
        f"node {node} down: gpuhub-test",
    )

    resume(slurm_cluster, node)
    assert slurm_cluster.run("squeue", "-h", "-u", member).stdout == ""  # still not rerun
    done = await ended(hub, token, await create(hub, token, "train.ipynb"), 240)
    assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    assert "squared: 4" in (mine / done["outputs"]["ipynb"]).read_text()

    async def both_settled():
        return len(await ledger(admin, member)) >= 5

    await eventually(both_settled, 30, f"{member}'s second job settled")
    await asyncio.sleep(1)  # a second settlement of either job would come by now
    kinds = [kind for kind, _ in await ledger(admin, member)]
    assert kinds == ["grant", "debit", "refund", "debit", "refund"], kinds


def accounted_end(cluster, slurm_job: str) -> tuple[str, str]:
    """Slurm's accounting of an ended job: its State's first word and its ExitCode
    (``("COMPLETED", "0:0")``, ``("CANCELLED", "0:15")``)."""

    def ended():
        out = cluster.run(
            "sacct", "-a", "-X", "-n", "-P", "-j", slurm_job, "-o", "State,ExitCode"
        ).stdout.split("\n")[0]
        state, _, code = out.partition("|")
        state = state.split(" ")[0]  # "CANCELLED by 1234"
        return (state, code) if state not in ("", "PENDING", "RUNNING", "COMPLETING") else None

    return cluster.wait_for(f"sacct to record the end of job {slurm_job}", ended, 30)


async def test_sacct_shows_a_failed_notebook_failed_and_a_stopped_job_cancelled(
    jobs_hub, slurm_cluster, admin
):
    """An operator reading Slurm's accounting sees how each job really ended: a notebook
    that raised is FAILED with its exit code (its runner exits by itself after its
    report), a job the member stopped is CANCELLED; each is settled once."""
    _need(slurm_cluster.accounting, "the test cluster keeps no accounting (slurmdbd)")
    member = slurm_cluster.fresh_member("ghs-job")
    workspace(
        slurm_cluster,
        member,
        {
            "broken.ipynb": notebook("raise ValueError('no data')"),
            "slow.ipynb": notebook("import time\ntime.sleep(600)"),
        },
    )
    hub = await jobs_hub()
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")

    failed = await ended(hub, token, await create(hub, token, "broken.ipynb"), 240)
    assert (failed["status"], failed["exit_code"]) == ("FAILED", 1), failed
    assert "ValueError: no data" in failed["status_message"], failed

    slow = await create(hub, token, "slow.ipynb")
    await status_is(hub, token, slow, "IN_PROGRESS", 240)
    r = await hub.api("POST", f"{JOBS}/{slow}/stop", token)
    assert r.status_code == 204, r.text
    stopped = await ended(hub, token, slow, 60)
    assert (stopped["status"], stopped["status_message"]) == ("STOPPED", "Stopped by you.")

    runs = {r.server_name: r for r in hub_runs(hub) if r.username == member}
    first, second = runs[failed["server_name"]], runs[stopped["server_name"]]
    assert accounted_end(slurm_cluster, first.job_id) == ("FAILED", "1:0")
    assert accounted_end(slurm_cluster, second.job_id)[0] == "CANCELLED"
    assert (first.stop_reason, second.stop_reason) == ("job_ended", "stopped")

    async def both_settled():
        got = await ledger(admin, member)
        return got if len(got) == 5 else None

    entries = await eventually(both_settled, 30, f"{member}'s two debits and refunds")
    assert [kind for kind, _ in entries] == ["grant", "debit", "refund", "debit", "refund"]
    await asyncio.sleep(2)  # a second settlement would come within the meter's period
    assert len(await ledger(admin, member)) == 5


async def test_a_members_jobs_on_one_profile_wait_behind_each_other_and_the_limit_holds(
    slurm_hub, slurm_cluster, credits_service, admin
):
    """Issue 28 on Slurm: three jobs posted at once by one member while every GPU is held,
    GPUHUB_JOBS_PER_USER=2: two created, one refused; the second waits behind the first
    (no "already in line" failure) and each runs once a GPU frees; the environment's label
    names the GPU once ("PyTorch, 1 GPU" is the profile's name)."""
    member = slurm_cluster.fresh_member("ghs-job")
    workspace(slurm_cluster, member, {"train.ipynb": GPU_NOTEBOOK})
    pytorch = {**PROFILES[1], "display_name": "PyTorch, 1 GPU"}
    hub = await slurm_hub(
        [PROFILES[0], pytorch],
        extra_config=QUICK,
        GPUHUB_CREDITS_URL=credits_service.url,
        GPUHUB_CREDITS_TOKEN=credits_service.hub_token,
        GPUHUB_JOBS_PER_USER="2",
    )
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")
    r = await hub.api("GET", f"{JOBS}/environments", token)
    [label] = [e["label"] for e in r.json()["environments"]]
    assert re.fullmatch(r"PyTorch, 1 GPU, 4\.00 credits/h, \d of \d free", label), label

    holds = hold_every_gpu(slurm_cluster, slurm_cluster.fresh_member("ghs-hold"))
    posts = await asyncio.gather(
        *(
            hub.api(
                "POST",
                JOBS,
                token,
                json={"input_uri": "train.ipynb", "runtime_environment_name": "gpu"},
            )
            for _ in range(3)
        )
    )
    assert sorted(r.status_code for r in posts) == [201, 201, 409], [r.text for r in posts]
    made = [r.json()["job_id"] for r in posts if r.status_code == 201]

    async def first_placed_second_behind():
        models = [await job(hub, token, j) for j in made]
        places = sorted(str((m.get("place") or {}).get("position")) for m in models)
        return models if places == ["1", "None"] else None

    models = await eventually(first_placed_second_behind, 60, "one in line, one behind it")
    assert {m["status"] for m in models} == {"QUEUED"}, models
    assert len(slurm_cluster.run("squeue", "-h", "-u", member).stdout.splitlines()) == 1

    slurm_cluster.run("scancel", holds[0])  # one GPU: the jobs run one after the other
    for job_id in made:
        done = await ended(hub, token, job_id, 240)
        assert (done["status"], done["exit_code"]) == ("COMPLETED", 0), done
    for held in holds[1:]:
        slurm_cluster.run("scancel", held)


async def test_only_the_jobs_own_server_token_ends_it_and_its_server_goes_with_it(
    jobs_hub, slurm_cluster, admin
):
    """Issue 28 on Slurm: a token the member makes with the server token's note and scopes
    may not report her job's end; a planted ``.gpuhub-job.json`` and JupyterHub's DELETE of
    the job's server end it FAILED, not COMPLETED, and leave no ``job-…`` server.  The
    ledger names the notebook job."""
    member = slurm_cluster.fresh_member("ghs-job")
    mine = workspace(
        slurm_cluster, member, {"slow.ipynb": notebook("import time\ntime.sleep(600)")}
    )
    hub = await jobs_hub()
    token = await hub.create_user(member)
    await grant(admin, member, "10.00")

    job_id = await create(hub, token, "slow.ipynb", name="slow")
    running = await status_is(hub, token, job_id, "IN_PROGRESS", 240)
    server = running["server_name"]
    r = await hub.api(
        "POST",
        f"/users/{member}/tokens",
        token,
        json={
            "note": f"Server at /user/{member}/{server}/",
            "scopes": [
                "users:activity!user",
                f"access:servers!server={member}/{server}",
                "custom:gpuhub:jobs!user",
            ],
        },
    )
    assert r.status_code in (200, 201), r.text
    r = await hub.api("POST", f"{JOBS}/{job_id}/report", r.json()["token"], json={"exit_code": 0})
    assert r.status_code == 403, r.text

    report = mine / running["output_dir"] / ".gpuhub-job.json"
    report.write_text('{"exit_code": 0, "error": ""}')
    entry = pwd.getpwnam(member)
    os.chown(report, entry.pw_uid, entry.pw_gid)
    r = await hub.api("DELETE", f"/users/{member}/servers/{server}", token)
    assert r.status_code in (202, 204), r.text
    failed = await ended(hub, token, job_id, 60)
    assert failed["status"] == "FAILED", failed

    async def forgotten():
        r = await hub.api("GET", f"/users/{member}?include_stopped_servers=1")
        return server not in r.json()["servers"]

    await eventually(forgotten, 20, "the job's server gone from her list")
    assert slurm_cluster.run("squeue", "-h", "-u", member).stdout == ""
    reasons = [t.reason async for t in admin.iter_transactions(member) if t.kind == "debit"]
    assert reasons and reasons[-1].startswith(
        f"Notebook job: slow, {member}/{server} (gpu) at 4 credits/hour"
    ), reasons
