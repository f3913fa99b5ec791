"""The submit host's command lines (hub_ext/slurm/submit.py): what the hub hands ssh, read by
a real shell as the remote login shell reads it.  No sshd here: ``LOOPBACK_SSH`` stands in
for ssh + sshd by running the remote command line with ``sh -c``, exactly what sshd does
with it (the tests with a real sshd: tests/test_slurm_submit_host.py)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from hub_ext.slurm.submit import DEFAULT_SSH, SubmitHost, SubmitHostUnavailable, check_host
from tests.fixtures.members import fake_user
from tests.test_config import configure

#: ``ssh [options] HOST -- LINE`` without the network: runs LINE in a shell, as sshd does
LOOPBACK_SSH = ("sh", "-c", 'shift 2; exec sh -c "$1"', "loopback-ssh")


def hostile(tmp_path) -> str:
    """A value that would run ``touch`` if any shell read it unquoted."""
    return f"x'; touch {tmp_path}/pwned; echo '$(touch {tmp_path}/pwned2) `id` \" \\ *"


def test_every_word_and_environment_value_reaches_the_remote_command_as_written(tmp_path):
    value = hostile(tmp_path)
    host = SubmitHost("login1", LOOPBACK_SSH)
    argv, _ = host.command(
        ["sh", "-c", 'printf "[%s]\\n" "$PROBE" "$@"', "sh", value, "b c"], env={"PROBE": value}
    )
    assert argv[:-1] == [*LOOPBACK_SSH, "login1", "--"]  # one line for the remote shell
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [f"[{value}]", f"[{value}]", "[b c]"]
    assert list(tmp_path.iterdir()) == []  # nothing ran


async def test_a_hostile_member_name_is_one_word_of_batchspawners_commands(tmp_path):
    """batchspawner formats ``exec_prefix`` + ``squeue ...`` into a shell line: the member's
    name is quoted there, and reaches the submit host as one argument."""
    from hub_ext.slurm.spawner import GPUSlurmSpawner

    name = hostile(tmp_path)
    user = fake_user(name, escaped_name="x")
    spawner = GPUSlurmSpawner(
        user=user,
        submit_host="login1",
        req_homedir="/tmp",
        req_keepvars="PATH",
        submit_ssh_command=list(LOOPBACK_SSH),
        exec_prefix="printf <%s> {username}",
    )
    spawner.job_id = "7"
    await spawner.query_job_status()
    assert spawner.job_status == f"<{name}><squeue><-h><-j><7><-o><%T %B>"
    assert list(tmp_path.iterdir()) == []


async def test_a_submit_host_that_does_not_answer_is_named_and_leaves_jobs_unknown():
    from hub_ext.slurm.spawner import GPUSlurmSpawner

    down = SubmitHost(
        "login1",
        (
            "sh",
            "-c",
            "echo 'ssh: connect to host login1 port 22: Connection refused' >&2; exit 255",
            "ssh",
        ),
    )
    with pytest.raises(
        SubmitHostUnavailable,
        match="submit host login1 did not answer: ssh: connect to host login1",
    ):
        await down.run(["sinfo"])

    user = fake_user()
    spawner = GPUSlurmSpawner(
        user=user,
        submit_host="login1",
        req_homedir="/tmp",
        req_keepvars="PATH",
        submit_ssh_command=list(down.ssh),
    )
    spawner.job_id = "7"
    # "unknown", not "gone": the hub's poll keeps the server (batchspawner's poll)
    assert (await spawner.query_job_status()).name == "UNKNOWN"


async def test_a_command_that_hangs_on_the_submit_host_counts_as_no_answer():
    slow = SubmitHost("login1", ("sh", "-c", "sleep 30", "ssh"))
    with pytest.raises(SubmitHostUnavailable, match="did not answer sinfo within 0.2 s"):
        await asyncio.wait_for(slow.run(["sinfo"], timeout=0.2), 10)


@pytest.mark.parametrize(
    "host", ["-oProxyCommand=touch /tmp/x", "login1 rm", "a;b", "$(id)", "@login1"]
)
def test_a_submit_host_that_is_not_a_host_is_refused_naming_the_setting(host):
    with pytest.raises(ValueError, match="GPUHUB_SLURM_SUBMIT_HOST"):
        check_host(host)


@pytest.mark.parametrize(
    "host", ["login1", "gpuhub@login1.example.org", "10.215.15.20", "[2001:db8::1]"]
)
def test_plain_hosts_and_users_are_accepted(host):
    assert check_host(host) == host


def test_an_environment_name_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="not an environment variable name"):
        SubmitHost("login1").command(["sinfo"], env={"A; touch x": "1"})


def test_without_a_submit_host_commands_run_here_with_the_environment_added():
    argv, env = SubmitHost().command(["sinfo", "-h"], env={"SLURM_CONF": "/etc/x.conf"})
    assert argv == ["sinfo", "-h"] and env["SLURM_CONF"] == "/etc/x.conf"


def test_the_submit_host_settings_reach_the_spawner(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_BACKEND="slurm",
        GPUHUB_SLURM_SUBMIT_HOST="gpuhub@login1",
        GPUHUB_SLURM_SSH_OPTIONS="-i '/srv/gpu hub/key' -p 2222",
    )
    assert c.GPUSlurmSpawner.submit_host == "gpuhub@login1"
    assert c.GPUSlurmSpawner.submit_ssh_command == [
        *DEFAULT_SSH,
        "-i",
        "/srv/gpu hub/key",
        "-p",
        "2222",
    ]


def test_a_malformed_submit_host_setting_stops_the_hub_with_its_name(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="GPUHUB_SLURM_SUBMIT_HOST"):
        configure(
            tmp_path,
            monkeypatch,
            GPUHUB_BACKEND="slurm",
            GPUHUB_SLURM_SUBMIT_HOST="-oProxyCommand=sh",
        )


async def test_the_api_token_and_the_hubs_own_paths_stay_on_the_hub():
    """batchspawner hands sbatch the job's environment: on the submit host it goes on the
    command line (visible in ``ps`` there), so the API token stays behind (the job reads
    its token file) and so do the hub's paths (the submit host's PATH finds its commands)."""
    from hub_ext.slurm.spawner import GPUSlurmSpawner

    user = fake_user()
    spawner = GPUSlurmSpawner(
        user=user,
        submit_host="login1",
        req_homedir="/tmp",
        req_keepvars="PATH",
        submit_ssh_command=list(LOOPBACK_SSH),
        slurm_env={"SLURM_CONF": "/etc/slurm/site.conf"},
    )
    out = await spawner.run_command(
        "env",
        env={
            "JUPYTERHUB_API_TOKEN": "s3cret",
            "JPY_API_TOKEN": "s3cret",
            "PATH": "/hub/only/bin",
            "JUPYTERHUB_USER": "ann",
        },
    )
    assert "s3cret" not in out and "/hub/only/bin" not in out
    assert {"JUPYTERHUB_USER=ann", "SLURM_CONF=/etc/slurm/site.conf"} <= set(out.splitlines())
