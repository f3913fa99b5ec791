"""Reading Slurm's own words: GRES strings (sinfo), jobs' GPUs (scontrol), start-time
estimates (squeue); and what the spawn page and the board make of them."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from hub_ext.common.limits import GIB, Request
from hub_ext.slurm.availability import gpus_in
from hub_ext.slurm.board import HubJob, board, pending_rows
from hub_ext.slurm.cluster import (
    JobGPUs,
    Node,
    QueuedJob,
    jobs_per_core,
    parse_gres,
    parse_gres_request,
    parse_job_details,
    parse_nodes,
)
from hub_ext.slurm.fit import job_request, sbatch_refusal, slurm_reason
from hub_ext.slurm.line import seconds_until


@pytest.mark.parametrize(
    "text, counts",
    [
        pytest.param("gpu:2", {"": 2}, id="untyped"),
        pytest.param("gpu:a100:2(S:0-1)", {"a100": 2}, id="typed-with-sockets"),
        pytest.param("gpu:a100:1(IDX:0),gpu:t4:2(IDX:0-1)", {"a100": 1, "t4": 2}, id="two-types"),
        pytest.param("gpu:1g.5gb:3", {"1g.5gb": 3}, id="mig-type"),
        pytest.param("(null)", {}, id="none"),
        pytest.param("gpu:0", {"": 0}, id="none-used"),
        pytest.param("mps:100,gpu:1", {"": 1}, id="not-a-gpu-left-out"),
    ],
)
def test_gres_strings_read_as_counts_per_type(text, counts):
    assert parse_gres(text) == counts


def test_a_profiles_gres_request_is_a_type_and_a_count():
    assert parse_gres_request("gpu:a100:2") == ("a100", 2)
    assert parse_gres_request("gpu:1") == ("", 1)
    assert parse_gres_request("") == ("", 0)


def test_a_drained_node_has_no_free_gpus():
    node = Node("node1", ["gpu"], "drained", {"": 2}, {"": 0})
    assert node.free() == 0
    assert Node("node2", ["gpu"], "mixed", {"a100": 2}, {"a100": 1}).free("a100") == 1


#: sinfo -N -O ... (hub_ext.slurm.cluster.SINFO_NODES) on the test cluster
SINFO = (
    "node1|gpu*|idle|gpu:2|gpu:0|10.215.15.11|12288|2|FORCE:2|none\n"
    "node2|gpu*|drained|gpu:a100:2(S:0)|gpu:a100:0|10.215.15.12|4096|8|NO|bad | fan\n"
    "node2|debug|drained|gpu:a100:2(S:0)|gpu:a100:0|10.215.15.12|4096|8|NO|bad | fan\n"
)


def test_sinfo_gives_each_nodes_memory_cpus_and_shared_cores():
    nodes, default = parse_nodes(SINFO)
    assert default == "gpu"
    node1, node2 = nodes
    assert (node1.memory_mb, node1.cpus, node1.jobs_per_core) == (12288, 2, 2)
    assert (node2.partitions, node2.reason, node2.jobs_per_core) == (
        ["gpu", "debug"],
        "bad | fan",
        1,
    )
    shape = node1.shape()
    assert (shape.memory_bytes, shape.cpus, shape.gpus, shape.cpu_servers) == (12 * GIB, 4.0, 2, 2)
    assert node2.capacity().gpus == {"a100": 2}


@pytest.mark.parametrize(
    "text, jobs", [("NO", 1), ("EXCLUSIVE", 1), ("FORCE:2", 2), ("YES:4", 4), ("FORCE", 1)]
)
def test_oversubscribe_is_jobs_per_core(text, jobs):
    assert jobs_per_core(text) == jobs


def test_a_jobs_request_is_what_the_spawner_submits():
    assert job_request({"mem_limit": "10847M", "cpu_limit": 0.5, "gpus": 1}) == Request(
        10847 * 2**20, 1.0, 1, ""
    )
    assert job_request({"req_memory": "2048", "req_gres": "gpu:a100:2"}) == Request(
        2 * GIB, None, 2, "a100"
    )


MEMORY = "sbatch: error: Memory specification can not be satisfied\n" + (
    "sbatch: error: Batch job submission failed: Requested node configuration is not available"
)


def test_an_sbatch_refusal_names_what_does_not_fit():
    nodes, _ = parse_nodes(SINFO)
    words = sbatch_refusal(MEMORY, "PyTorch, 1 GPU", Request(20 * GIB, 1.0, 1), "gpu", nodes)
    assert words == (
        "PyTorch, 1 GPU cannot start on this cluster: it asks for 20 GB of memory (at most "
        "12 GB on the nodes of partition gpu). Ask an admin to fix the profile."
    )
    # a refusal for something else: Slurm's own reason
    qos = "sbatch: error: Batch job submission failed: Invalid qos specification"
    assert slurm_reason(qos) == "Invalid qos specification"
    assert sbatch_refusal(qos, "CPU only", Request(GIB, 1.0), "gpu", nodes) == (
        "The cluster refused to run CPU only (Invalid qos specification). Ask an admin to "
        "check the profile."
    )


def test_slurms_start_time_becomes_seconds_from_now():
    now = datetime(2026, 11, 23, 12, 0, 0)
    assert seconds_until("2026-11-23T12:09:01", now) == 541
    assert seconds_until("2026-11-23T11:59:00", now) == 0
    assert seconds_until("N/A", now) is None
    # what Slurm's backfill says of a job it cannot place: a year ahead
    assert seconds_until("2027-11-23T12:00:00", now) is None


def test_a_slurm_board_prints_as_a_table_without_a_hub_of_its_own(capsys, monkeypatch):
    """``gpuhub gpus`` on a Slurm board: the node's reason, the job, the queue."""
    from hub_ext import cli

    board = {
        "inventory": "slurm",
        "error": "",
        "devices": [
            {
                "index": "node1:0",
                "uuid": "node1/gpu0",
                "state": "drained",
                "health_reason": "bad fan",
                "utilization_pct": None,
                "memory_used_mib": None,
                "memory_total_mib": None,
                "processes": [],
                "owner": None,
            }
        ],
        "nodes": [{"name": "node1", "state": "drained", "reason": "bad fan", "available": False}],
        "pending": [
            {
                "position": 1,
                "job": "42",
                "partition": "gpu",
                "reason": "Resources",
                "expected_start": None,
                "user": "ann",
                "server": "",
                "profile": "gpu",
                "known": True,
            }
        ],
    }
    monkeypatch.setattr(cli, "board_from_hub", lambda settings: board)
    assert cli.main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"node1/gpu0\s+drained\s.*bad fan$", out, re.M)
    assert "node node1 is drained: bad fan" in out
    assert re.search(r"^\s+1\s+42\s+gpu\s+Resources\s+unknown\s+ann \(gpu\)$", out, re.M)


def test_a_jobs_gpus_are_read_per_node_from_scontrol():
    out = (
        "JobId=7 JobName=gpuhub-ann-default UserId=ann(1001) GroupId=ann(1001) "
        "JobState=RUNNING Reason=None Partition=gpu StartTime=2026-11-23T12:00:00 "
        "JOB_GRES=gpu:a100:2   Nodes=node1 CPU_IDs=0-1 Mem=0 GRES=gpu:a100:2(IDX:0-1) "
        "MinCPUsNode=1\n"
        "JobId=8 JobName=wrap UserId=bob(1002) GroupId=bob(1002) JobState=PENDING "
        "Reason=Resources Partition=gpu StartTime=Unknown\n"
    )
    running, pending = parse_job_details(out)
    assert (running.job_id, running.user, running.gpus, running.start) == (
        "7",
        "ann",
        {"node1": [0, 1]},
        "2026-11-23T12:00:00",
    )
    assert (pending.state, pending.reason, pending.gpus, pending.start) == (
        "PENDING",
        "Resources",
        {},
        "",
    )
    assert parse_job_details("No jobs in the system\n") == []


def nodes() -> list[Node]:
    return [
        Node("node1", ["gpu"], "mixed", {"": 2}, {"": 1}),
        Node("node2", ["gpu"], "drained", {"": 2}, {"": 0}, reason="bad fan"),
        Node("node3", ["gpu"], "mixed", {"a100": 1, "t4": 1}, {"t4": 1}),
    ]


@pytest.mark.parametrize(
    "kind, count, free, total, refusal, can_wait",
    [
        pytest.param("", 1, 2, 4, "", True, id="any-gpu-free"),
        pytest.param(
            "",
            2,
            2,
            4,
            "needs 2 GPUs on one node and only 2 of 4",
            True,
            id="two-but-on-no-one-node",
        ),
        pytest.param("a100", 1, 1, 1, "", True, id="typed-free"),
        pytest.param("h100", 1, 0, 0, "has 1 h100 GPUs", False, id="type-no-node-has"),
    ],
)
def test_free_gpus_per_profile_count_only_nodes_that_take_jobs(
    kind, count, free, total, refusal, can_wait
):
    gpus = gpus_in(nodes(), "gpu", kind, count)
    assert (gpus.free, gpus.total, gpus.can_wait) == (free, total, can_wait)
    assert (refusal in gpus.refusal) if refusal else gpus.refusal == ""


def test_the_board_names_each_gpus_job_member_and_a_drained_nodes_reason():
    jobs = [
        JobGPUs(
            "7",
            "gpuhub-ann-default",
            "ann",
            "RUNNING",
            "gpu",
            "2026-11-23T12:00:00",
            gpus={"node1": [1]},
        ),
        JobGPUs("9", "wrap", "zed", "RUNNING", "gpu", "", gpus={"node3": [1]}),
    ]
    rows = {r["uuid"]: r for r in board(nodes(), jobs, {"7": HubJob("ann", "", "gpu")}, "/hub/")}
    assert rows["node1/gpu0"]["state"] == "free"
    held = rows["node1/gpu1"]
    assert held["state"] == "held"
    assert (held["owner"]["user"], held["owner"]["job"], held["owner"]["stop_url"]) == (
        "ann",
        "7",
        "/hub/api/users/ann/server",
    )
    assert rows["node2/gpu0"]["state"] == "drained"
    assert rows["node2/gpu0"]["health_reason"] == "bad fan"
    outside = rows["node3/gpu1"]
    assert (outside["state"], outside["owner"]["user"], outside["owner"]["stop_url"]) == (
        "outside",
        "zed",
        None,
    )
    assert (outside["name"], rows["node3/gpu0"]["state"]) == ("node3 GPU 1 (t4)", "free")


def test_pending_jobs_keep_slurms_order_and_count_places_per_partition():
    queue = [
        QueuedJob("11", "PENDING", "ann", "gpuhub-ann-default", "gpu", 10, "Priority"),
        QueuedJob("12", "PENDING", "bob", "x", "big", 9, "Resources"),
        QueuedJob("13", "PENDING", "cy", "x", "gpu", 8, "Priority"),
        QueuedJob("7", "RUNNING", "dee", "x", "gpu", 0, "None", "node1"),
    ]
    rows = pending_rows(
        queue, {"11": "2026-11-23T12:30:00"}, {"11": HubJob("ann", "", "gpu")}, "/hub/"
    )
    assert [(r["job"], r["position"], r["partition"]) for r in rows] == [
        ("11", 1, "gpu"),
        ("12", 1, "big"),
        ("13", 2, "gpu"),
    ]
    assert rows[0]["expected_start"] == "2026-11-23T12:30:00" and rows[0]["known"]
    assert rows[1]["expected_start"] is None and rows[1]["stop_url"] is None


def test_a_job_name_or_comment_cannot_pass_for_another_job_or_claim_its_gpus():
    """Job names and comments are the submitter's text and ``scontrol -o`` prints them
    raw: a job named like another job's fields must not take that job's id (the board
    would then give the stranger's GPU a Stop button for ann's server)."""
    out = (
        "JobId=7 JobName=gpuhub-ann-default UserId=ann(1001) GroupId=ann(1001) "
        "JobState=RUNNING Reason=None Partition=gpu StartTime=2026-11-23T12:00:00 "
        "JOB_GRES=gpu:1   Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:1) MinCPUsNode=1 "
        "Comment=(null)\n"
        "JobId=9 JobName=x JobId=7 UserId=zed(1003) GroupId=zed(1003) JobState=RUNNING "
        "Reason=None Partition=gpu StartTime=2026-11-23T12:01:00 JOB_GRES=gpu:1   "
        "Nodes=node1 CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:0) MinCPUsNode=1 "
        "Comment=y JobId=7\n"
    )
    jobs = {j.job_id: j for j in parse_job_details(out)}
    assert set(jobs) == {"7", "9"}
    assert (jobs["7"].user, jobs["7"].gpus) == ("ann", {"node1": [1]})
    assert (jobs["9"].user, jobs["9"].gpus) == ("zed", {"node1": [0]})
    rows = {
        r["uuid"]: r
        for r in board(nodes(), list(jobs.values()), {"7": HubJob("ann", "", "gpu")}, "/hub/")
    }
    assert rows["node1/gpu0"]["owner"]["stop_url"] is None
    assert rows["node1/gpu1"]["owner"]["stop_url"] == "/hub/api/users/ann/server"


def test_a_job_id_that_a_name_repeats_on_a_line_of_its_own_claims_no_gpus():
    """A name with a line break could print a whole forged line; an id on two lines is
    ambiguous, so neither line's GPUs are given to it."""
    out = (
        "JobId=7 JobName=gpuhub-ann-default UserId=ann(1001) JobState=RUNNING "
        "Partition=gpu JOB_GRES=gpu:1   Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:1)\n"
        "JobId=9 JobName=x\n"
        "JobId=7 UserId=ann(1001) JobState=RUNNING Partition=gpu JOB_GRES=gpu:1   "
        "Nodes=node1 CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:0) UserId=zed(1003) "
        "JobState=RUNNING Partition=gpu\n"
    )
    jobs = parse_job_details(out)
    assert [j.gpus for j in jobs if j.job_id == "7"] == [{}]


def test_a_bar_in_a_job_name_cannot_move_the_job_in_slurms_queue():
    """``squeue`` prints the name raw; a name holding ``|`` must not change the job's
    partition or priority (its place in line, the board's pending rows)."""
    from hub_ext.slurm.cluster import QUEUE_FORMAT, parse_queue

    assert QUEUE_FORMAT.endswith("|%j")
    out = (
        "11|PENDING|ann|gpu|10|Priority|(null)|gpuhub-ann-default\n"
        "12|PENDING|zed|big|1|Priority|(null)|x|gpu|99999|Priority|\n"
    )
    jobs = parse_queue(out)
    assert [(j.job_id, j.partition, j.priority, j.name) for j in jobs] == [
        ("11", "gpu", 10, "gpuhub-ann-default"),
        ("12", "big", 1, "x|gpu|99999|Priority|"),
    ]


@pytest.mark.parametrize(
    "idx",
    [
        pytest.param("1-2-3", id="not-a-range"),
        pytest.param("0-99999999999", id="a-range-no-node-has"),
    ],
)
def test_gpu_indexes_written_into_a_job_name_cannot_break_or_stall_the_board(idx):
    """A stranger's job name is printed raw on its ``scontrol`` line: an index list no
    Slurm writes is passed over (the board still renders, and the hub does not count to a
    hundred billion on its event loop)."""
    from hub_ext.slurm.cluster import MAX_GPU_INDEX, parse_indexes

    out = (
        f"JobId=9 JobName=x Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu(IDX:{idx}) "
        "UserId=zed(1003) JobState=RUNNING Partition=gpu JOB_GRES=gpu:1   "
        "Nodes=node1 CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:0)\n"
    )
    [job] = parse_job_details(out)
    assert all(0 <= i <= MAX_GPU_INDEX for i in job.gpus["node1"])
    assert 0 in job.gpus["node1"]
    assert parse_indexes("0-1,3") == [0, 1, 3]


def test_a_job_on_several_nodes_holds_its_gpus_on_each_of_them():
    """``scontrol`` folds nodes with the same allocation into one hostlist (seen on the
    test cluster: ``sbatch -N2 --gres=gpu:1``); each node's GPU is held, none is free."""
    out = (
        "JobId=518 JobName=wrap UserId=root(0) JobState=RUNNING Partition=gpu "
        "NodeList=node[1-2] JOB_GRES=gpu:2   Nodes=node[1-2] CPU_IDs=0 Mem=0 "
        "GRES=gpu:1(IDX:0) MinCPUsNode=1\n"
    )
    [job] = parse_job_details(out)
    assert job.gpus == {"node1": [0], "node2": [0]}
    rows = {r["uuid"]: r for r in board(nodes(), [job], {}, "/hub/")}
    assert rows["node1/gpu0"]["state"] == "outside"
    assert rows["node1/gpu1"]["state"] == "free"


@pytest.mark.parametrize(
    "text, names",
    [
        pytest.param("node1", ["node1"], id="one"),
        pytest.param("node[1-3,5]", ["node1", "node2", "node3", "node5"], id="ranges"),
        pytest.param("gpu[09-11]", ["gpu09", "gpu10", "gpu11"], id="zero-padded"),
        pytest.param("a,b[1-2]", ["a", "b1", "b2"], id="a-list"),
        pytest.param("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"], id="two-brackets"),
        pytest.param("n[0-99999999]", [], id="more-nodes-than-any-cluster"),
        pytest.param("n[1-", [], id="not-a-hostlist"),
    ],
)
def test_slurm_hostlists_expand_as_scontrol_show_hostnames_does(text, names):
    from hub_ext.slurm.cluster import expand_hostlist

    assert expand_hostlist(text) == names


def test_a_hostlist_up_to_the_bound_expands_and_one_past_it_does_not():
    from hub_ext.slurm.cluster import MAX_HOSTS, expand_hostlist

    assert len(expand_hostlist(f"n[1-{MAX_HOSTS - 1}]")) == MAX_HOSTS - 1
    assert expand_hostlist("n[" + ",".join(["0-999"] * 5) + "]") == []


def test_a_strangers_job_cannot_take_over_a_hub_jobs_gpu_on_the_board():
    """A stranger's ``scontrol`` line may claim any GPU in its name (``Nodes=node1 ...
    GRES=gpu(IDX:1)``); the hub's own job's claim stands, with its Stop button."""
    forged = parse_job_details(
        "JobId=9 JobName=x Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu(IDX:1) UserId=zed(1003) "
        "JobState=RUNNING Partition=gpu\n"
    )
    jobs = [
        JobGPUs("7", "gpuhub-ann-default", "ann", "RUNNING", "gpu", "", gpus={"node1": [1]}),
        *forged,
    ]
    for order in (jobs, jobs[::-1]):
        rows = {
            r["uuid"]: r for r in board(nodes(), order, {"7": HubJob("ann", "", "gpu")}, "/hub/")
        }
        owner = rows["node1/gpu1"]["owner"]
        assert (owner["job"], owner["stop_url"]) == ("7", "/hub/api/users/ann/server")


async def test_an_images_labels_are_read_off_the_event_loop(tmp_path):
    """The image folder is on storage the nodes share (NFS at a site): the spawn page,
    polled by every member, must not wait on it in the hub's event loop.  Here the
    labels file is a FIFO that blocks its reader until a writer comes; the writer comes
    when the loop has ticked (or, to end the test, after 10 s regardless)."""
    import asyncio
    import json
    import os
    import threading

    from hub_ext.slurm.availability import image_facts

    folder = tmp_path / "gpuhub_base_latest"
    (folder / "rootfs").mkdir(parents=True)
    os.mkfifo(folder / "labels.json")

    ticked = threading.Event()

    def writer():
        ticked.wait(10)
        with open(folder / "labels.json", "w") as fifo:
            fifo.write(json.dumps({"io.gpuhub.python.version": "3.11"}))

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    reading = asyncio.ensure_future(image_facts(str(folder / "rootfs")))
    await asyncio.sleep(0.01)  # the loop runs on while the read waits
    loop_was_free = not reading.done()
    ticked.set()
    facts = await reading
    thread.join()
    assert loop_was_free
    assert facts["python"] == "3.11"


@pytest.mark.parametrize(
    ("req", "limits", "expected"),
    [
        pytest.param(("", ""), ("16G", 4), ("16384M", "4"), id="profile-limits"),
        pytest.param(("", ""), (300 * 2**20 + 1, 0.5), ("301M", "1"), id="rounded-up"),
        pytest.param(("4G", "3"), ("1G", 1), ("4G", "3"), id="req-wins"),
        pytest.param(("", ""), (None, None), ("", ""), id="none"),
    ],
)
def test_the_profiles_limits_become_the_jobs_slurm_request(req, limits, expected):
    from hub_ext.slurm.batch import slurm_request

    assert slurm_request(*req, *limits) == expected


def test_a_memory_limit_slurm_cannot_be_asked_for_is_refused_naming_it():
    from hub_ext.slurm.batch import slurm_request

    with pytest.raises(ValueError, match="^mem_limit: lots is not a valid memory"):
        slurm_request("", "", "lots", 1)


def test_a_notebook_jobs_batch_script_runs_the_runner_with_its_job_exported():
    """The same container as a server's, behind the sandbox network's wrapper (it reports
    the port, as batchspawner's does: hub_ext/slurm/sandbox_net.py), with
    gpuhub-notebook-job in place of JupyterLab and
    GPUHUB_JOB among the variables sbatch exports into the job, with
    GPUHUB_JOB_EXIT_AFTER_REPORT (the runner ends the batch job by itself once reported)."""
    from hub_ext.jobs.workload import NotebookJob
    from hub_ext.slurm.spawner import GPUSlurmSpawner
    from tests.fixtures.members import fake_user

    spawner = GPUSlurmSpawner(user=fake_user(), req_homedir="/tmp", req_keepvars="PATH")
    server = spawner.batch_job(spawner.cmd_formatted_for_batch()).script
    spawner.workload = NotebookJob({"id": "0123", "input": "a.ipynb", "max_seconds": 600})
    job = spawner.batch_job(spawner.cmd_formatted_for_batch()).script
    assert "#SBATCH --export=PATH,GPUHUB_WORKSPACE_MOUNT,GPUHUB_KERNEL_TRANSPORT\n" in server
    assert (
        "#SBATCH --export=PATH,GPUHUB_WORKSPACE_MOUNT,GPUHUB_KERNEL_TRANSPORT,GPUHUB_JOB,"
        "GPUHUB_JOB_ROOT,GPUHUB_JOB_EXIT_AFTER_REPORT\n"
    ) in job
    assert "#SBATCH --job-name=gpuhub-notebook-ann-" in job
    wrapper = " python3 /tmp/gpuhub-net.py inside -- "
    container = server.rsplit("exec ", 1)[1].split(wrapper)[0]
    assert job.rsplit("exec ", 1)[1] == (
        f"{container}{wrapper}gpuhub-notebook-job --KernelManager.transport=ipc"
    )
    assert spawner.core_environment()["GPUHUB_JOB"] == json.dumps(
        spawner.workload.value, sort_keys=True
    )
    assert spawner.core_environment()["GPUHUB_JOB_EXIT_AFTER_REPORT"] == "1"


def batch_job(**given):
    from hub_ext.slurm.batch import BATCH_SCRIPT, BWRAP, make_batch_job

    base = dict(
        template=BATCH_SCRIPT,
        username="ann",
        job_name="gpuhub-ann-default",
        workspace="/shared/home/ann",
        workspace_mount="/home/jovyan/work",
        token_file="/shared/home/ann/.gpuhub/token-default",
        gpu_device="/dev/nvidia$i",
        container_command=BWRAP,
        rootfs="/images/gpuhub_base_latest/rootfs",
        image="gpuhub/base:latest",
        datasets={},
        batchspawner_dir="/venv/batchspawner",
        container_path="/opt/venv/bin:/usr/bin",
        environment=["GPUHUB_WORKSPACE_MOUNT"],
        command="python3 -m batchspawner.singleuser jupyterhub-singleuser",
    )
    request = {"partition": "gpu", "gres": "gpu:1", "memory": "2048M", "keepvars": "PATH"}
    return make_batch_job({**request, **given.pop("request", {})}, **{**base, **given})


def test_a_servers_batch_job_asks_slurm_for_the_profiles_request():
    job = batch_job(request={"runtime": "8:00:00", "nprocs": "2"})
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --mem=2048M",
        "#SBATCH --time=8:00:00",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --job-name=gpuhub-ann-default",
        "#SBATCH --export=PATH,GPUHUB_WORKSPACE_MOUNT",
        "#SBATCH --output=/shared/home/ann/.gpuhub/slurm-%j.log",
        "#SBATCH --no-requeue",
    ):
        assert line + "\n" in job.script
    assert "--account" not in job.script and "--reservation" not in job.script
    last = job.script.rstrip().splitlines()[-1]
    assert last.startswith("exec bwrap ") and "--chdir /home/jovyan" in last
    assert last.endswith(" python3 -m batchspawner.singleuser jupyterhub-singleuser")


def test_a_groups_reservation_and_the_datasets_reach_the_batch_job():
    job = batch_job(
        reservation="gpuhub-7",
        request={"options": "--qos=short"},
        datasets={"mnist": "/data/mnist", "in": "/data/image net"},
    )
    assert "#SBATCH --qos=short --reservation=gpuhub-7\n" in job.script
    assert job.options["options"] == "--qos=short --reservation=gpuhub-7"
    assert (
        "--tmpfs /datasets --ro-bind '/data/image net' /datasets/in "
        "--ro-bind /data/mnist /datasets/mnist --remount-ro /datasets"
    ) in job.script


def test_every_value_a_member_gives_is_one_word_of_the_commands():
    job = batch_job(username="a b;rm -rf /", workspace="/shared/home/a b")
    assert job.options["username"] == "'a b;rm -rf /'"
    assert "--bind '/shared/home/a b' /home/jovyan/work" in job.options["container"]


@pytest.mark.parametrize(
    ("runtime", "max_seconds", "expected"),
    [
        pytest.param("", 600, "11", id="its-own-limit-plus-a-minute"),
        pytest.param("", 61, "3", id="minutes-rounded-up"),
        pytest.param("8:00:00", 86400, "8:00:00", id="the-sites-shorter-limit"),
        pytest.param("2-00:00:00", 3600, "61", id="shorter-than-the-sites"),
        pytest.param("UNLIMITED", 3600, "61", id="site-unlimited"),
        pytest.param("30", 0, "30", id="no-job-limit"),
    ],
)
def test_a_jobs_maximum_run_time_becomes_its_slurm_time_limit(runtime, max_seconds, expected):
    from hub_ext.slurm.batch import job_time_limit

    assert job_time_limit(runtime, max_seconds) == expected


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("90", 90),
        ("1:30", 2),
        ("1:00:00", 60),
        ("1-2", 1560),
        ("1-2:03", 1563),
        ("1-02:03:04", 1564),
        ("INFINITE", None),
    ],
)
def test_slurm_time_limits_read_as_minutes(text, minutes):
    from hub_ext.slurm.batch import slurm_minutes

    assert slurm_minutes(text) == minutes


@pytest.mark.parametrize("text", ["1h", "-5", "1:2:3:4", "a-1"])
def test_a_time_limit_slurm_would_not_read_is_refused(text):
    from hub_ext.slurm.batch import slurm_minutes

    with pytest.raises(ValueError, match="not a Slurm time limit"):
        slurm_minutes(text)


def check(spawner):
    """What the Slurm spawner's checks ask of a notebook job's image."""
    from hub_ext.slurm.batch import check_runner, rootfs_of

    check_runner(
        rootfs_of(spawner.image_dir, spawner.image),
        spawner.image,
        spawner.workload.command[0],
        spawner.container_path,
        spawner.workload.noun,
        spawner.log,
    )


def test_a_job_on_an_image_without_the_runner_is_refused_before_it_is_submitted(tmp_path):
    """The unpacked image the nodes run must hold gpuhub-notebook-job on the container's
    PATH; one built before notebook jobs existed is refused with a sentence to act on."""
    from tornado import web

    from hub_ext.jobs.workload import NotebookJob
    from hub_ext.slurm.spawner import GPUSlurmSpawner
    from tests.fixtures.members import fake_user

    spawner = GPUSlurmSpawner(user=fake_user(), image_dir=str(tmp_path), image="site/old:1")
    spawner.workload = NotebookJob({"id": "0123"})
    runner = tmp_path / "site_old_1" / "rootfs" / "usr" / "local" / "bin" / "gpuhub-notebook-job"
    runner.parent.mkdir(parents=True)
    with pytest.raises(web.HTTPError) as refused:
        check(spawner)
    assert (refused.value.status_code, refused.value.log_message) == (
        500,
        "The image site/old:1 on the cluster cannot run notebook jobs (it has no "
        "gpuhub-notebook-job). Ask an admin to rebuild it and unpack it again.",
    )
    runner.write_text("#!/opt/venv/bin/python\n")
    check(spawner)  # found on the container's PATH
