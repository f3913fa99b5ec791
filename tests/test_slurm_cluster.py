"""The local Slurm cluster the Slurm backend is tested on (scripts/slurm-cluster.sh): two
compute nodes with two GPUs each, and Slurm's own exclusivity (GRES + devices cgroup),
shown with plain batch jobs submitted by members under their own uids."""

from __future__ import annotations

import asyncio
import shutil

import pytest

pytestmark = pytest.mark.slurm

HOLD = "sleep 300"


def _submit(cluster, user, script, *args):
    out = cluster.run(
        "sbatch",
        "--parsable",
        "--gres=gpu:1",
        "--cpus-per-task=1",
        f"--output={cluster.shared}/{user}/%j.out",
        *args,
        f"--wrap={script}",
        user=user,
    ).stdout
    return out.strip().split(";")[0]


@pytest.fixture
def members(slurm_cluster):
    names = [f"ghs-m{i}" for i in range(1, 6)]
    for name in names:
        slurm_cluster.member(name)
        d = slurm_cluster.shared / name
        d.mkdir(exist_ok=True)
        shutil.chown(d, name, name)
    yield names
    slurm_cluster.cancel_all()


def test_the_cluster_has_two_nodes_with_two_gpus_each(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %G").stdout.split("\n")
    nodes = dict(line.split() for line in out if line.strip())
    assert nodes == {"node1": "gpu:2", "node2": "gpu:2"}


def test_four_gpu_jobs_get_four_different_gpus_on_both_nodes_and_a_fifth_waits(
    slurm_cluster, members
):
    """Each job reports its node, the GPU index Slurm gave it on that node
    (``SLURM_JOB_GPUS``) and its ``CUDA_VISIBLE_DEVICES``; no two share a GPU."""
    report = 'echo "$SLURMD_NODENAME $SLURM_JOB_GPUS $CUDA_VISIBLE_DEVICES $(id -un)"; ' + HOLD
    jobs = {name: _submit(slurm_cluster, name, report) for name in members[:4]}

    def reports():
        seen = {}
        for name, job in jobs.items():
            path = slurm_cluster.shared / name / f"{job}.out"
            text = path.read_text().strip() if path.exists() else ""
            if not text:
                return None
            seen[name] = text.split()
        return seen

    seen = slurm_cluster.wait_for("four jobs to report their GPUs", reports)
    assert {name: who for name, (_, _, _, who) in seen.items()} == {m: m for m in members[:4]}
    gpus = {(node, gpu) for node, gpu, _, _ in seen.values()}
    assert gpus == {("node1", "0"), ("node1", "1"), ("node2", "0"), ("node2", "1")}
    # with ConstrainDevices the job sees only its own device, so CUDA numbers it 0
    expected_cuda = "0" if slurm_cluster.cgroup_mode != "none" else None
    if expected_cuda:
        assert {cuda for _, _, cuda, _ in seen.values()} == {expected_cuda}

    fifth = _submit(slurm_cluster, members[4], "true")

    def scheduled():  # the reason is "None" until the scheduler has looked at the job
        state = slurm_cluster.run("squeue", "-h", "-j", fifth, "-o", "%T %r").stdout.split()
        return state if state[1:] != ["None"] else None

    assert slurm_cluster.wait_for("the fifth job to be scheduled", scheduled) == [
        "PENDING",
        "Resources",
    ]

    slurm_cluster.run("scancel", jobs[members[0]])
    slurm_cluster.wait_for(
        "the fifth job to run once a GPU is free",
        lambda: slurm_cluster.job_state(fifth) in ("RUNNING", "COMPLETING", ""),
    )


def test_a_job_cannot_open_a_gpu_it_was_not_given(slurm_cluster, members):
    """The devices cgroup (cgroup.conf ConstrainDevices=yes): the allocated stand-in GPU
    opens as far as the missing driver (ENXIO), the other one is denied (EPERM)."""
    if slurm_cluster.cgroup_mode == "none":
        pytest.fail("this machine has no cgroup devices controller: Slurm cannot fence GPUs")
    name = members[0]
    script = (
        "for d in $(ls /srv/gpuhub-slurm/dev/$SLURMD_NODENAME/); do "
        'echo "$d $SLURM_JOB_GPUS $(head -c1 /srv/gpuhub-slurm/dev/$SLURMD_NODENAME/$d '
        '2>&1 >/dev/null | sed s/.*://)"; done'
    )
    script = script.replace("/srv/gpuhub-slurm", str(slurm_cluster.dir))
    job = _submit(slurm_cluster, name, script, "-w", "node1")
    out = slurm_cluster.shared / name / f"{job}.out"
    slurm_cluster.wait_for(
        "the job to finish", lambda: slurm_cluster.job_state(job) == "" and out.exists()
    )
    lines = [line.split(" ", 2) for line in out.read_text().strip().split("\n")]
    given = lines[0][1]
    answers = {device: why.strip() for device, _, why in lines}
    assert answers == {
        f"nvidia{g}": (
            "No such device or address" if str(g) == given else "Operation not permitted"
        )
        for g in (0, 1)
    }


async def test_a_pending_job_has_its_place_in_line_and_slurms_estimate(slurm_cluster, members):
    """Position from Slurm's priority order; the estimate from ``squeue --start`` (the
    running jobs' 10-minute limits tell Slurm when a GPU frees)."""
    from hub_ext.line.order import place_sentence
    from hub_ext.slurm.cluster import SlurmCluster
    from hub_ext.slurm.line import SlurmQueue

    holds = [_submit(slurm_cluster, name, HOLD, "--time=10") for name in members[:4]]
    slurm_cluster.wait_for(
        "every GPU to be taken", lambda: all(slurm_cluster.job_state(j) == "RUNNING" for j in holds)
    )
    first = _submit(slurm_cluster, members[4], "true", "--time=5")
    second = _submit(slurm_cluster, members[0], "true", "--time=5")
    queue = SlurmQueue(SlurmCluster(env=slurm_cluster.env), line=None)

    async def estimated():
        await queue.read(fresh=True)
        return all((queue.job_standing(j) or (0, None))[1] is not None for j in (first, second))

    deadline = asyncio.get_running_loop().time() + 60
    while not await estimated():  # the backfill pass (bf_interval) makes the estimates
        assert asyncio.get_running_loop().time() < deadline, queue.queued
        await asyncio.sleep(0.5)
    (one, wait), (two, _) = queue.job_standing(first), queue.job_standing(second)
    assert (one, two) == (1, 2)
    assert 0 < wait <= 10 * 60
    # the single-node backend's sentence, with Slurm's estimate
    assert place_sentence(one, 1, "GPU", "One GPU", wait, 3600, queue.no_estimate).startswith(
        "You are 1st in line for 1 GPU (One GPU). Estimated wait: about "
    )
    assert queue.job_standing(holds[0]) is None  # running: not in line
