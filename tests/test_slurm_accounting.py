"""Reading Slurm's accounting (sacct --parsable2) for ``gpuhub usage``: GPUs from AllocTRES,
hostile lines passed over, reused job ids matched to the right run, and a site without
accounting told apart from a failing one.  sacct's words here are Slurm 22.05's, as the
test cluster's slurmdbd prints them (tests/test_slurm_accounting_hub.py runs the real one)."""

from __future__ import annotations

import io
import shutil
import socket
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from hub_ext.ops.usage import UsageRow, _print, _print_jobs, summarise
from hub_ext.slurm.accounting import (
    AccountedJob,
    Accounting,
    AccountingNotConfigured,
    accounted_jobs,
    epoch,
    match_runs,
    parse_alloc_gpus,
    parse_sacct,
    read_accounting,
)
from hub_ext.slurm.cluster import SlurmUnavailable
from tests.fixtures.hub import _need

T0 = datetime(2026, 3, 2, 9, 0, 0)  # naive UTC, as the run records keep it
E0 = int(epoch(T0))


@pytest.mark.parametrize(
    "tres, gpus",
    [
        pytest.param("billing=1,cpu=1,gres/gpu=2,mem=4G,node=1", 2, id="untyped"),
        pytest.param("cpu=2,gres/gpu:a100=1,gres/gpu=1,node=1", 1, id="typed-and-total"),
        pytest.param("cpu=2,gres/gpu:a100=1,gres/gpu:t4=2", 3, id="typed-only"),
        pytest.param("billing=1,cpu=1,node=1", 0, id="no-gpus-in-tres"),
        pytest.param("", 0, id="empty"),
        pytest.param("gres/gpu=-1", 0, id="negative"),
        pytest.param("gres/gpu=1e9", 0, id="not-a-number"),
        pytest.param("gres/gpu=99999999999", 0, id="absurd-count"),
        pytest.param("gres/gpu=²", 0, id="unicode-digit"),
        pytest.param("gres/gpumem=80G,gres/gpu=1", 1, id="gpumem-is-not-gpus"),
    ],
)
def test_gpus_are_read_from_alloc_tres(tres, gpus):
    assert parse_alloc_gpus(tres) == gpus


def line(
    job="12",
    user="ann",
    state="COMPLETED",
    elapsed="30",
    start=E0,
    end=E0 + 30,
    tres="billing=1,cpu=1,gres/gpu=1,node=1",
) -> str:
    return "|".join([job, user, state, elapsed, str(start), str(end), tres])


def test_sacct_lines_become_jobs():
    out = "\n".join(
        [
            line(),
            line("13", state="CANCELLED by 0", end="Unknown"),
            line("14", state="PENDING", elapsed="0", start="Unknown", end="Unknown"),
        ]
    )
    assert parse_sacct(out) == [
        AccountedJob("12", "ann", "COMPLETED", 30, E0, E0 + 30, 1),
        AccountedJob("13", "ann", "CANCELLED by 0", 30, E0, None, 1),
        AccountedJob("14", "ann", "PENDING", 0, None, None, 1),
    ]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(line() + "|extra", id="a-field-too-many"),
        pytest.param("12|ann|COMPLETED|30|0", id="too-few-fields"),
        pytest.param(line(job="12.batch"), id="a-step"),
        pytest.param(line(job="12|13"), id="pipe-in-the-id"),
        pytest.param(line(job="JobIDRaw"), id="a-header"),
        pytest.param(line(elapsed="00:00:30"), id="elapsed-not-raw"),
        pytest.param(line(job="１２"), id="fullwidth-digits"),
        pytest.param("sacct: error: Problem talking to the database", id="an-error"),
        pytest.param("", id="nothing"),
    ],
)
def test_sacct_lines_that_are_not_a_job_are_passed_over(text):
    assert parse_sacct(text) == []


def test_times_that_are_not_unix_seconds_are_unknown():
    # a prefix that does not carry SLURM_TIME_FORMAT would give ISO local times: no guess
    [job] = parse_sacct(line(start="2026-03-02T09:00:00", end="2026-03-02T09:00:30"))
    assert (job.start, job.end, job.elapsed_s) == (None, None, 30)
    assert job.gpu_seconds(T0, T0 + timedelta(hours=1)) == 0.0


def test_gpu_seconds_count_only_inside_the_period():
    job = AccountedJob("12", "ann", "COMPLETED", 3600, E0, E0 + 3600, 2)
    assert job.gpu_seconds(T0, T0 + timedelta(hours=2)) == 7200
    assert job.gpu_seconds(T0 + timedelta(minutes=30), T0 + timedelta(hours=2)) == 3600
    assert job.gpu_seconds(T0 - timedelta(hours=2), T0 - timedelta(hours=1)) == 0
    running = AccountedJob("13", "ann", "RUNNING", 60, E0, None, 1)
    assert running.gpu_seconds(T0, (T0 + timedelta(minutes=10)).replace(tzinfo=UTC)) == 600


def run(
    run_id=1,
    job_id="12",
    started=T0,
    stopped=T0 + timedelta(seconds=25),
    gpus=1,
    username="ann",
    server_name="",
):
    return SimpleNamespace(
        id=run_id,
        job_id=job_id,
        started_at=started,
        stopped_at=stopped,
        devices=[f"node1/gpu{i}" for i in range(gpus)],
        gpus=gpus,
        username=username,
        server_name=server_name,
        groups=[],
        credits_run=None,
        line_wait_s=None,
    )


def test_a_reused_job_id_is_matched_to_the_job_that_carried_the_run():
    # slurmctld -i (or MaxJobId) gave id 12 again: last month's job 12 is another member's
    old = AccountedJob("12", "bob", "COMPLETED", 7200, E0 - 30 * 86400, E0 - 30 * 86400 + 7200, 2)
    ours = AccountedJob("12", "ann", "CANCELLED by 0", 31, E0 - 4, E0 + 27, 1)
    later = AccountedJob("12", "cy", "COMPLETED", 10, E0 + 3600, E0 + 3610, 1)
    assert match_runs([run()], {"12": [old, ours, later]}) == {1: ours}


def test_a_run_without_a_job_or_whose_job_accounting_lacks_is_left_out():
    ours = AccountedJob("12", "ann", "COMPLETED", 30, E0 - 2, E0 + 28, 1)
    runs = [run(1, job_id=None), run(2, job_id="99"), run(3)]
    assert match_runs(runs, {"12": [ours]}) == {3: ours}


class FakeSacct:
    """Answers ``cluster.run`` as sacct would, recording the commands."""

    def __init__(self, out="", error=None):
        self.out, self.error, self.calls = out, error, []

    async def run(self, *argv, timeout=None):
        self.calls.append(argv)
        if self.error:
            raise SlurmUnavailable(f"{' '.join(argv)}: {self.error}")
        return self.out


async def test_sacct_is_asked_for_the_runs_jobs_with_unix_times_and_no_job_names():
    sacct = FakeSacct("\n".join([line("12"), line("13"), line("77")]))
    found = await accounted_jobs(sacct, ["13", "12", "12", "x;rm -rf /"])
    [argv] = sacct.calls
    assert argv[:2] == ("env", "SLURM_TIME_FORMAT=%s")
    assert argv[argv.index("-j") + 1] == "12,13"  # what is not a job id is not asked for
    assert "JobName" not in argv[argv.index("-o") + 1]
    assert {"-X", "-P", "--duplicates", "-a"} <= set(argv)
    assert sorted(found) == ["12", "13"]  # a job not asked for is not taken


async def test_many_jobs_are_asked_for_in_several_calls():
    sacct = FakeSacct()
    await accounted_jobs(sacct, [str(i) for i in range(1, 1201)])
    assert len(sacct.calls) == 3


async def test_a_site_without_accounting_is_told_apart_from_a_failing_one():
    with pytest.raises(AccountingNotConfigured, match="Slurm accounting storage is disabled"):
        await accounted_jobs(FakeSacct(error="Slurm accounting storage is disabled"), [])
    with pytest.raises(SlurmUnavailable, match="Connection refused"):
        await accounted_jobs(FakeSacct(error="sacct: error: Connection refused"), ["12"])


def test_the_report_shows_slurm_gpu_hours_beside_the_hubs():
    runs = [run(1, started=T0, stopped=T0 + timedelta(hours=1), gpus=2)]
    rows = summarise(
        runs,
        None,
        T0.replace(tzinfo=UTC),
        (T0 + timedelta(days=1)).replace(tzinfo=UTC),
        "user",
        accounted={1: 2 * 3660.0},
    )
    assert (rows[0].gpu_hours, rows[0].slurm_gpu_hours) == (2.0, pytest.approx(2.0333, 1e-3))
    out = io.StringIO()
    _print(rows, "user", True, out, slurm=True)
    assert out.getvalue().splitlines()[1] == "ann,1,2.00,-,0,-,2.03"
    out = io.StringIO()
    _print([UsageRow("ann", 1, 2.0)], "user", False, out, slurm=True)
    assert out.getvalue().splitlines()[0].endswith("SLURM GPU-HOURS")
    assert out.getvalue().splitlines()[1].endswith("-")  # accounting not read


def test_jobs_list_each_run_beside_its_job():
    runs = [run(1, server_name="a|b,c"), run(2, job_id=None)]
    ours = AccountedJob("12", "ann", "CANCELLED by 0", 31, E0 - 4, E0 + 27, 1)
    since, until = T0.replace(tzinfo=UTC), (T0 + timedelta(days=1)).replace(tzinfo=UTC)
    out = io.StringIO()
    _print_jobs(runs, {1: ours}, since, until, True, out)
    assert out.getvalue().splitlines() == [
        "job,user,server,state,gpus,slurm_gpus,seconds,slurm_elapsed_s,gpu_hours,slurm_gpu_hours",
        '12,ann,"a|b,c",CANCELLED by 0,1,1,25,31,0.0069,0.0075',  # CSV quotes member text
        "-,ann,-,-,1,-,25,-,0.0069,-",
    ]


@pytest.mark.parametrize(
    "value, read",
    [
        pytest.param("", "auto", id="default"),
        pytest.param("ON", "on", id="any-case"),
        pytest.param("off", "off", id="off"),
    ],
)
def test_slurm_accounting_setting_is_auto_on_or_off(monkeypatch, value, read):
    from hub_ext.config import Settings

    monkeypatch.setenv("GPUHUB_SLURM_ACCOUNTING", value)
    assert Settings.from_env().slurm_accounting == read


def test_a_slurm_accounting_setting_of_another_word_names_the_choices(monkeypatch):
    from hub_ext.config import Settings

    monkeypatch.setenv("GPUHUB_SLURM_ACCOUNTING", "yes")
    with pytest.raises(
        ValueError, match="GPUHUB_SLURM_ACCOUNTING='yes': use 'auto', 'on' or 'off'"
    ):
        Settings.from_env()


def slurm_settings(**given) -> SimpleNamespace:
    """The Slurm part of :class:`hub_ext.config.Settings` that ``read_accounting`` reads."""
    return SimpleNamespace(**{"slurm_submit_host": "", "slurm_ssh_options": "", **given})


def test_accounting_off_asks_slurm_nothing():
    settings = slurm_settings(slurm_accounting="off", slurm_conf="/nonexistent/slurm.conf")
    assert read_accounting(settings, [run()]) == Accounting(
        None, "Slurm accounting is off (GPUHUB_SLURM_ACCOUNTING=off)"
    )


@pytest.mark.slurm
def test_a_slurmdbd_that_does_not_answer_is_said_in_sacct_s_words(tmp_path):
    # the real sacct, pointed at a slurmdbd port where nothing listens
    _need(shutil.which("sacct") is not None, "Slurm's sacct is not installed (scripts/setup.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=gone",
                "SlurmctldHost=localhost(127.0.0.1)",
                "AuthType=auth/munge",
                f"AuthInfo=socket={tmp_path}/munge.socket",
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={port}",
                f"AccountingStoragePass={tmp_path}/munge.socket",
                "NodeName=n1 CPUs=1",
                "PartitionName=p Nodes=n1",
                "",
            ]
        )
    )
    settings = slurm_settings(slurm_accounting="auto", slurm_conf=str(conf))
    assert read_accounting(settings, [run()]) == Accounting(
        None,
        "Slurm's accounting cannot be read (sacct: error: Problem talking to the "
        "database: Connection refused)",
        failed=True,
    )


def test_accounting_is_read_on_the_submit_host():
    # sacct runs where the hub's other Slurm commands run: a submit host that does not
    # answer (nothing listens on the port given in GPUHUB_SLURM_SSH_OPTIONS) says so
    _need(shutil.which("ssh") is not None, "OpenSSH's ssh is not installed (scripts/setup.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = slurm_settings(
        slurm_accounting="auto",
        slurm_conf="",
        slurm_submit_host="gpuhub@127.0.0.1",
        slurm_ssh_options=f"-p {port} -o ControlMaster=no",
    )
    got = read_accounting(settings, [run()])
    assert (got.jobs, got.failed) == (None, True)
    assert "ssh: connect to host 127.0.0.1" in got.note, got.note
