"""What a member can do from inside her own Slurm server, tried as she would: post to the
hub's port-report endpoint with her server's token, read what the job runs, and what other
cluster accounts can read of hers.  A real hub and proxy, the two-node test cluster, the
notebook image in the nodes' container runtime (tests/fixtures/slurm.py)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess

import pytest

from hub_ext.slurm.cluster import MEMBER_PREFIX
from tests.fixtures.hub import eventually, terminal_run
from tests.test_slurm_pages import hub_runs

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [{"display_name": "CPU only", "slug": "cpu", "default": True}]

#: Posts each body of the JSON list argv[1] to the hub's batchspawner endpoint with the
#: server's own token, as batchspawner's wrapper does; prints "ANSWER <status> <body>".
POSTER = """
import json, os, sys, urllib.error, urllib.request
for body in json.loads(sys.argv[1]):
    req = urllib.request.Request(
        os.environ["JUPYTERHUB_API_URL"] + "/batchspawner", data=json.dumps(body).encode(),
        headers={"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"],
                 "Content-Type": "application/json"}, method="POST")
    try:
        r = urllib.request.urlopen(req, timeout=10)
        status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    print("ANSWER", status, json.loads(text).get("message", ""))
print("POSTED")
"""


def as_member(ws, name: str, filename: str, text: str) -> None:
    """A file of the member's in her workspace (what she would write from her server)."""
    path = ws / filename
    path.write_text(text)
    shutil.chown(path, name, name)


async def test_a_member_cannot_set_her_spawner_through_the_port_report(
    slurm_hub, slurm_cluster, tmp_path
):
    name = slurm_cluster.fresh_member("ghs-atk")
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    token = await hub.create_user(name)
    r = await hub.spawn(name, {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name, timeout=180)  # the wrapper's own report was taken
    [job] = slurm_cluster.run("squeue", "-h", "-u", name, "-o", "%i").stdout.split()

    proof = tmp_path / "proof"
    os.chmod(tmp_path, 0o755)
    evil = f"sh -c 'id > {proof}; exec \"$@\"' sh {MEMBER_PREFIX}"
    bodies = [
        {"exec_prefix": evil},
        {"job_id": "999999"},
        {"hook_state": {}},
        {"port": "8888"},
        {"port": 8888, "exec_prefix": evil},
        {"port": 8888},
        [8888],
    ]
    ws = slurm_cluster.shared / "home" / name
    as_member(ws, name, "poster.py", POSTER)
    out = await terminal_run(
        hub,
        name,
        token,
        f"python3 work/poster.py {shlex.quote(json.dumps(bodies))}",
        expect="POSTED",
        timeout=60,
    )
    answers = re.findall(r"ANSWER (\d+) (.*?)\r?\n", out)
    assert [(int(s), m.split(":")[0]) for s, m in answers] == [
        (400, "exec_prefix"),
        (400, "job_id"),
        (400, "hook_state"),
        (400, "port"),
        (400, "exec_prefix"),
        (400, "port"),  # a valid port, after the start
        (400, "The body must be a JSON object"),
    ], out

    # not a server's token: her own API token, the admin's
    for who in (token, hub.admin_token):
        r = await hub.client.post(
            "/hub/api/batchspawner", json={"port": 8888}, headers={"Authorization": f"token {who}"}
        )
        assert r.status_code == 403, r.text

    # the server still answers, still metered under its own job; the stop cancels that
    # job with the hub's own member prefix (no command of hers ran as root)
    assert await terminal_run(
        hub, name, token, "echo STILL-$((6*7))", expect="STILL-42", timeout=60
    )
    [run] = [r for r in hub_runs(hub) if r.username == name]
    assert (run.job_id, run.stopped_at) == (job, None)
    await hub.stop_server(name, timeout=120)
    slurm_cluster.wait_for(
        "the job to end", lambda: slurm_cluster.job_state(job) in ("", "COMPLETED", "CANCELLED")
    )
    [run] = [r for r in hub_runs(hub) if r.username == name]
    assert run.job_id == job and run.stopped_at is not None
    assert not proof.exists()


async def test_the_job_runs_the_images_packages_and_its_files_are_hers_alone(
    slurm_hub, slurm_cluster, slurm_image
):
    name, other = slurm_cluster.fresh_member("ghs-img"), slurm_cluster.fresh_member("ghs-oth")
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    token = await hub.create_user(name)
    r = await hub.spawn(name, {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name, timeout=180)
    ws = slurm_cluster.shared / "home" / name
    as_member(
        ws,
        name,
        "look.py",
        (
            "import os, jupyterhub, soupsieve\n"
            "print('LOOK', sorted(os.listdir('/tmp/gpuhub-batchspawner')), jupyterhub.__file__,"
            " soupsieve.__version__, 'END')\n"
        ),
    )
    out = await terminal_run(
        hub, name, token, "touch work/new; python3 work/look.py", expect="END", timeout=60
    )
    listing, jupyterhub_file, version = re.findall(r"LOOK (\[.*?\]) (\S+) (\S+) END", out)[-1]
    # the wrapper's folder holds batchspawner alone; Jupyter's packages are the image's
    assert listing == "['batchspawner']"
    assert jupyterhub_file.startswith("/opt/venv/")
    rootfs = slurm_cluster.dir / "images" / slurm_image.replace("/", "_").replace(":", "_")
    [meta] = (rootfs / "rootfs").glob(
        "opt/venv/lib/python3*/site-packages/soupsieve-*.dist-info/METADATA"
    )
    assert f"\nVersion: {version}\n" in meta.read_text()

    # another cluster account reads nothing of hers: not the workspace, not the job's log
    [log] = (ws / ".gpuhub").glob("slurm-*.log")
    for argv in (["ls", str(ws)], ["cat", str(log)], ["cat", str(ws / "new")]):
        done = subprocess.run(["runuser", "-u", other, "--", *argv], capture_output=True, text=True)
        assert done.returncode != 0 and "Permission denied" in done.stderr, (argv, done)
    assert oct((ws / "new").stat().st_mode & 0o777) == oct(0o600)  # umask 077 in the job


async def test_her_terminal_is_bash_with_her_name_as_in_the_docker_images(slurm_hub, slurm_cluster):
    """JupyterLab's terminal on a Slurm node: bash (not sh), a prompt with her name, and
    ``id`` naming her and her group (not a bare ``uid=1003 gid=1003``), whatever her login
    shell on the cluster (Slurm sets the job's SHELL from it): /bin/sh here, Debian's
    ``useradd`` default, as the Slurm demo's accounts have."""
    name = slurm_cluster.fresh_member("ghs-term")
    subprocess.run(["usermod", "--shell", "/bin/sh", name], check=True)
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    token = await hub.create_user(name)
    r = await hub.spawn(name, {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name, timeout=180)
    out = await terminal_run(
        hub, name, token, 'id; echo "SHELL $0 $HOME $SHELL END"', expect="END", timeout=60
    )
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", out)  # bash's bracketed paste mode
    account = pwd.getpwnam(name)
    group = grp.getgrgid(account.pw_gid).gr_name
    assert f"uid={account.pw_uid}({name}) gid={account.pw_gid}({group})" in out, out
    assert re.search(r"SHELL \S*bash /home/jovyan /bin/bash END", out), out
    assert re.search(rf"(^|\n){re.escape(name)}@[^:\s]+:~\S*\$ ", out), out  # the prompt
    assert "I have no name" not in out


#: Two processes busy for 3 s, then the server made the first the cgroup's OOM killer
#: takes (oom_score_adj, which a process may raise for its own), then memory allocated
#: past the limit.
BURN = """
import os, resource, time
print("CORES", len(os.sched_getaffinity(0)), flush=True)
start = time.time()
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.time() - start < 3:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print("CPU %.2f WALL %.2f END" % (used.ru_utime + used.ru_stime, time.time() - start),
      flush=True)
with open("/proc/%d/stat" % os.getppid()) as f:  # the terminal's shell: its parent
    server = int(f.read().rsplit(")", 1)[1].split()[1])
with open("/proc/%d/oom_score_adj" % server, "w") as f:
    f.write("1000")
hog = [bytearray(32 * 2**20) for _ in range(40)]
"""


async def test_a_cpu_job_gets_its_one_core_and_is_stopped_past_its_memory(slurm_hub, slurm_cluster):
    profiles = [
        {
            "display_name": "Small CPU",
            "slug": "small",
            "default": True,
            "spawner_override": {"mem_limit": "400M", "cpu_limit": 1},
        }
    ]
    name = slurm_cluster.fresh_member("ghs-oom")
    hub = await slurm_hub(
        profiles, GPUHUB_CREDITS="off", extra_config="c.GPUSlurmSpawner.poll_interval = 1\n"
    )
    token = await hub.create_user(name)
    browser = await hub.login(name)
    r = await hub.spawn(name, {"profile": "small"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name, timeout=180)
    [job] = slurm_cluster.run("squeue", "-h", "-u", name, "-o", "%i").stdout.split()
    out = slurm_cluster.run("scontrol", "show", "job", job).stdout
    assert "TRES=cpu=1,mem=400M" in out, out  # the profile's limits are the job's request

    ws = slurm_cluster.shared / "home" / name
    as_member(ws, name, "burn.py", BURN)
    out = await terminal_run(hub, name, token, "python3 work/burn.py", expect="END", timeout=60)
    cores, cpu, wall = re.findall(r"CORES (\d+).*?CPU ([\d.]+) WALL ([\d.]+) END", out, re.S)[-1]
    assert int(cores) == 1
    assert float(cpu) <= 1.3 * float(wall), out  # one core's time, not two

    async def stopped():
        return await hub.stopped(name)

    await eventually(stopped, timeout=90, what="the server stopped by its cgroup")
    [run] = [r for r in hub_runs(hub) if r.username == name]
    assert run.job_id == job
    assert run.stop_reason == "out_of_memory"
    assert run.stop_detail == (
        "out of memory: the server used more than its 400M (Slurm: OUT_OF_MEMORY)"
    )
    home = await browser.get("/hub/home")  # she is told why, on her home page
    assert (
        "Your server was stopped: it used more than its 400 MB of memory. Save your work "
        "more often, use less memory, or choose a profile with more."
    ) in home.text


#: What a member looks for from her terminal: other workspaces, the hub's state, munge's
#: key, other members' processes, Slurm's commands, a user namespace of her own.
LOOK_AROUND = (
    "echo SEEN:$(ls -d {others} 2>/dev/null | wc -l):"
    '$(ps -eo user= | grep -vcx "$(id -un)\\|$(id -u)"):'
    "$(command -v sbatch scancel srun | wc -l):"
    "$(unshare -Urn true 2>/dev/null && echo 1 || echo 0):END"
)


async def test_what_held_a_member_sees_only_her_own_and_bad_requests_are_refused(
    slurm_hub, slurm_cluster
):
    alice, bob = slurm_cluster.fresh_member("ghs-al"), slurm_cluster.fresh_member("ghs-bo")
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    tokens = {name: await hub.create_user(name) for name in (alice, bob)}
    for name in (alice, bob):
        r = await hub.spawn(name, {"profile": "cpu"})
        assert r.status_code in (201, 202), r.text
    for name in (alice, bob):
        await hub.wait_ready(name, timeout=180)

    others = " ".join(
        str(p)
        for p in (
            slurm_cluster.shared / "home" / bob,
            hub.state_dir,
            slurm_cluster.dir / "munge",
            slurm_cluster.dir / "munge" / "munge.key",
        )
    )
    out = await terminal_run(
        hub, alice, tokens[alice], LOOK_AROUND.format(others=others), expect=":END", timeout=60
    )
    assert re.findall(r"SEEN:(\d+):(\d+):(\d+):(\d+):END", out)[-1] == ("0",) * 4, out

    # PrivateData: on the submit host her own squeue lists her job and not bob's, and her
    # sacct (all users asked) not bob's, where the hub's own (root's) list both (members
    # without a slurmdbd user record get no job from sacct at all)
    def jobs(*argv: str, user: str | None = None) -> set[str]:
        return set(slurm_cluster.run(*argv, user=user).stdout.split())

    names = {name: f"gpuhub-{name}-default" for name in (alice, bob)}
    assert set(names.values()) <= jobs("squeue", "-h", "-o", "%j")
    assert jobs("squeue", "-h", "-o", "%j", user=alice) == {names[alice]}
    sacct = ("sacct", "-a", "-X", "-n", "-o", "JobName%60")
    slurm_cluster.wait_for(
        "both jobs in Slurm's accounting", lambda: set(names.values()) <= jobs(*sacct)
    )
    assert names[bob] not in jobs(*sacct, user=alice)

    # bob's server answers her with 403, with her token or none
    for headers in ({"Authorization": f"token {tokens[alice]}"}, {}):
        r = await hub.client.get(f"/user/{bob}/api/status", headers=headers)
        assert r.status_code == 403, (headers, r.status_code)

    # forged options, an oversized body, server names with shell or #SBATCH text
    for path, body in (
        (f"/users/{alice}/servers/x", {"profile": "gpu-x"}),
        (f"/users/{alice}/servers/x", {"profile": "cpu", "req_gres": "gpu:4"}),
        (f"/users/{alice}/servers/x", {"profile": "cpu", "pad": "x" * 20000}),
        (f"/users/{alice}/servers/a%0A%23SBATCH%20--uid=0", {}),
        (f"/users/{alice}/servers/a$(id)", {}),
    ):
        r = await hub.api("POST", path, token=tokens[alice], json=body)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    jobs = slurm_cluster.run("squeue", "-h", "-u", alice, "-o", "%j").stdout.split()
    assert jobs == [f"gpuhub-{alice}-default"]

    # a hub user with no account on the cluster (mallory) gets nothing
    mallory = "mallory-" + alice.rsplit("-", 1)[1]
    await hub.create_user(mallory)
    r = await hub.spawn(mallory, {"profile": "cpu"})
    assert r.status_code == 403 and "no account on the cluster" in r.text, r.text
    assert not slurm_cluster.run(
        "squeue", "-h", "-n", f"gpuhub-{mallory}-default", check=False
    ).stdout.strip()
