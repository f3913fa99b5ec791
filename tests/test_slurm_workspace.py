"""The member's workspace the hub prepares as root before each Slurm job
(``hub_ext.slurm.batch.prepare_workspace``): hers, private, and made without following a link she
controls, even while she swaps its folders for links from another process."""

from __future__ import annotations

import logging
import os
import pwd
import stat
import subprocess
import time
from types import SimpleNamespace

import pytest
from tornado import web

from hub_ext.slurm.batch import member_ids, prepare_workspace

pytestmark = pytest.mark.slurm

#: The member's racer: swaps ``.gpuhub`` with a link to the root file ``argv[2]`` as fast
#: as it can (renameat2 RENAME_EXCHANGE), keeping a fresh link ready.
RACER = r"""
import ctypes, os, sys
os.chdir(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE = -100, 2
while True:
    try:
        os.symlink(sys.argv[2], "bait")
    except FileExistsError:
        pass
    for _ in range(50):
        libc.renameat2(AT_FDCWD, b".gpuhub", AT_FDCWD, b"bait", RENAME_EXCHANGE)
    if os.path.isdir("bait") and not os.path.islink("bait"):
        try:
            os.rmdir("bait")
        except OSError:
            pass
"""


def job(name: str, workspace: str):
    """What the spawner's checks run for member ``name`` (``workspace``: the setting)."""

    def prepare():
        return prepare_workspace(
            workspace.format(username=name), *member_ids(name), logging.getLogger(), name
        )

    return SimpleNamespace(prepare_workspace=prepare)


def remove(path: str) -> None:
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            os.rmdir(path)
    except OSError:
        pass


def test_a_racer_swapping_gpuhub_for_a_link_never_gets_a_root_file(slurm_cluster, tmp_path):
    name = slurm_cluster.fresh_member("ghs-race")
    uid = pwd.getpwnam(name).pw_uid
    target = tmp_path / "root-secret"
    target.write_text("root's\n")
    target.chmod(0o600)
    os.chmod(tmp_path, 0o755)  # the member may name it in a link, not change it
    home = slurm_cluster.shared / "home"
    home.mkdir(parents=True, exist_ok=True)
    ws = home / name
    spawner = job(name, str(home / "{username}"))
    spawner.prepare_workspace()
    member = pwd.getpwnam(name)

    def as_member():  # the racer itself becomes the member (runuser would fork it away)
        os.setgid(member.pw_gid)
        os.setgroups([])
        os.setuid(member.pw_uid)

    racer = subprocess.Popen(
        ["/usr/bin/python3", "-c", RACER, str(ws), str(target)], preexec_fn=as_member
    )
    tries = refused = 0
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            remove(str(ws / ".gpuhub"))
            tries += 1
            try:
                spawner.prepare_workspace()
            except web.HTTPError as e:
                assert e.status_code == 500
                refused += 1
            assert os.lstat(target).st_uid == 0, f"root's file became hers on try {tries}"
    finally:
        racer.kill()
        racer.wait()
    assert racer.returncode == -9  # it raced to the end (killed, not failed)
    info = os.lstat(target)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    assert tries > 200 and refused > 0, (tries, refused)  # the racer did win the name
    assert os.lstat(ws).st_uid == uid


def test_a_gpuhub_link_is_refused_and_not_followed(slurm_cluster, tmp_path):
    name = slurm_cluster.fresh_member("ghs-link")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    home = slurm_cluster.shared / "home"
    home.mkdir(parents=True, exist_ok=True)
    ws = home / name
    spawner = job(name, str(home / "{username}"))
    spawner.prepare_workspace()
    (ws / ".gpuhub").rmdir()
    subprocess.run(
        ["runuser", "-u", name, "--", "ln", "-s", str(elsewhere), str(ws / ".gpuhub")], check=True
    )
    with pytest.raises(web.HTTPError) as e:
        spawner.prepare_workspace()
    assert e.value.status_code == 500
    assert "holds a link" in e.value.log_message
    info = os.stat(elsewhere)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o755)


def test_the_workspace_and_gpuhub_are_private_to_the_member(slurm_cluster):
    name, other = slurm_cluster.fresh_member("ghs-priv"), slurm_cluster.fresh_member("ghs-oth")
    home = slurm_cluster.shared / "home"
    home.mkdir(parents=True, exist_ok=True)
    ws = home / name
    job(name, str(home / "{username}")).prepare_workspace()
    subprocess.run(
        [
            "runuser",
            "-u",
            name,
            "--",
            "sh",
            "-c",
            f"echo notes > {ws}/notes.txt && echo log > {ws}/.gpuhub/job.log",
        ],
        check=True,
    )
    uid = pwd.getpwnam(name).pw_uid
    for d in (ws, ws / ".gpuhub"):
        info = os.stat(d)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uid, 0o700), d
    for argv in (
        ["ls", str(ws)],
        ["cat", str(ws / "notes.txt")],
        ["cat", str(ws / ".gpuhub" / "job.log")],
    ):
        done = subprocess.run(["runuser", "-u", other, "--", *argv], capture_output=True, text=True)
        assert done.returncode != 0 and "Permission denied" in done.stderr, (argv, done)
