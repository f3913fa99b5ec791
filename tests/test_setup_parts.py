"""``scripts/setup.sh`` installs what its caller needs: the Docker demo neither Slurm, nor its
database, nor an ssh server; the Slurm demo and the tests install those."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.fixtures.hub import REPO

SLURM_ONLY = {
    "slurm-wlm",
    "munge",
    "bubblewrap",
    "slirp4netns",  # the jobs' outbound traffic (GPUHUB_SLURM_OUTBOUND)
    "passt",
    "slurmdbd",
    "mariadb-server",
}
TESTS_ONLY = {"openssh-server", "postgresql", "chromium", "docker-compose"}


def packages(*args: str) -> set[str]:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), *args, "--list-packages"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return set(done.stdout.split())


def test_docker_demo_installs_no_slurm_database_or_ssh_server():
    demo = packages("--for", "demo")
    assert {"docker.io", "iptables"} <= demo  # iptables: the members' network's rules
    assert not demo & (SLURM_ONLY | TESTS_ONLY)


def test_slurm_demo_installs_slurm_and_its_accounting_but_not_the_test_tools():
    slurm = packages("--for", "slurm")
    assert SLURM_ONLY <= slurm
    assert not slurm & TESTS_ONLY


def test_tests_install_everything():
    assert SLURM_ONLY | TESTS_ONLY | packages("--for", "slurm") <= packages()


@pytest.mark.parametrize("purpose", ["", "cluster"])
def test_unknown_purpose_is_refused(purpose):
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), "--for", purpose, "--list-packages"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--for takes demo, slurm, tests or docs" in done.stderr


def test_the_clusters_word_on_a_missing_sshd_names_a_setup_that_installs_it():
    """``scripts/slurm-cluster.sh start`` without sshd (the Slurm demo's machine) says where
    the hub submits instead and which ``setup.sh --for`` installs the submit host's server."""
    script = (REPO / "scripts" / "slurm-cluster.sh").read_text()
    words = re.search(r'say "(no submit host[^"]*)"', script)
    assert words, "slurm-cluster.sh no longer says 'no submit host'"
    named = re.findall(r"setup\.sh(?: --for (\w+))?", words.group(1))
    assert named, words.group(1)
    said = words.group(1)
    for purpose in named:
        assert purpose, f"plain 'scripts/setup.sh' is not what the Slurm demo ran: {said}"
        assert "openssh-server" in packages("--for", purpose), said
    assert "the hub submits on this machine" in said
