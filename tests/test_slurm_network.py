"""The Slurm job's own network, without a cluster: the batch script's part of it
(hub_ext/slurm/network.py, a pure function) and the runner's pieces (hub_ext/slurm/
sandbox_net.py: its forwarders and the bounded log) on this machine's sockets and files.
With a real cluster and two members: tests/test_slurm_network_hub.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from hub_ext.slurm import sandbox_net
from hub_ext.slurm.network import RUNNER, NetworkScript, network_script
from tests.fixtures.hub import REPO


def test_an_isolated_sandbox_gets_its_own_network_and_the_runners_forwarders():
    script = network_script(True, "slirp4netns", 1000, "python3", "/opt/hub/sandbox_net.py")
    assert 'gpuhub_net=$(mktemp -d "${TMPDIR:-/tmp}/gpuhub-net.XXXXXXXX")' in script.prologue
    assert script.runner == (
        'python3 /opt/hub/sandbox_net.py node --dir "$gpuhub_net" --outbound slirp4netns'
        " --log-max-bytes 1000 -- "
    )
    assert script.binds == (
        '--unshare-net --bind "$gpuhub_net" /tmp/gpuhub-net'
        " --ro-bind /opt/hub/sandbox_net.py /tmp/gpuhub-net.py"
    )
    assert script.wrapper == "python3 /tmp/gpuhub-net.py inside --"


def test_a_sandbox_that_is_not_isolated_gets_nothing():
    assert network_script(False, "none", 0, "python3") == NetworkScript()


def test_an_unknown_outbound_network_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="none, slirp4netns, pasta"):
        network_script(True, "tun", 0, "python3")


async def test_the_default_batch_script_runs_the_server_in_its_own_network():
    from hub_ext.slurm.spawner import GPUSlurmSpawner
    from tests.fixtures.members import fake_user

    spawner = GPUSlurmSpawner(user=fake_user(), req_homedir="/tmp", req_keepvars="PATH")
    script = await spawner._get_batch_script(
        **spawner.get_req_subvars(), cmd=spawner.cmd_formatted_for_batch()
    )
    last = script.rsplit("exec ", 1)[1]
    assert last.startswith(f'python3 {RUNNER} node --dir "$gpuhub_net" --outbound none ')
    assert " -- bwrap --unshare-user " in last
    assert ' --unshare-net --bind "$gpuhub_net" /tmp/gpuhub-net ' in last
    assert " python3 /tmp/gpuhub-net.py inside -- jupyterhub-singleuser" in last
    assert "batchspawner.singleuser" not in last


async def test_a_container_command_without_the_network_field_shares_the_nodes():
    from hub_ext.slurm.spawner import GPUSlurmSpawner
    from tests.fixtures.members import fake_user

    spawner = GPUSlurmSpawner(
        user=fake_user(), req_homedir="/tmp", req_keepvars="PATH", container_command="runc "
    )
    script = await spawner._get_batch_script(
        **spawner.get_req_subvars(), cmd=spawner.cmd_formatted_for_batch()
    )
    assert script.rsplit("exec ", 1)[1].startswith("runc  python3 -m batchspawner.singleuser ")


async def _echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data.upper())
        await writer.drain()
    writer.close()


async def test_a_forwarder_carries_bytes_both_ways_between_tcp_and_a_unix_socket(tmp_path):
    path = str(tmp_path / "server.sock")
    inner = await asyncio.start_unix_server(_echo, path)
    outer = await asyncio.start_server(
        sandbox_net.Forwarder(sandbox_net.unix_to(path)), "127.0.0.1", 0
    )
    port = outer.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = b"x" * 300_000 + b"end"
    writer.write(payload)
    writer.write_eof()  # the half-close reaches the far side, which then closes
    answer = await asyncio.wait_for(reader.read(), 10)
    assert answer == payload.upper()
    writer.close()
    for server in (outer, inner):
        server.close()


async def test_a_forwarder_closes_a_connection_it_cannot_carry(tmp_path):
    outer = await asyncio.start_server(
        sandbox_net.Forwarder(sandbox_net.unix_to(str(tmp_path / "nobody.sock"))), "127.0.0.1", 0
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", outer.sockets[0].getsockname()[1])
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    outer.close()


def test_the_jobs_log_is_rotated_past_its_size(tmp_path):
    # the runner's stdout is Slurm's --output file: past the size it becomes <log>.1 and a
    # new log begins, so the two hold the latest output (issue 28: a 700 MiB log)
    log = tmp_path / "slurm-7.log"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import sandbox_net\n"
        "log = sandbox_net.RotatingLog(1000)\n"
        "for i in range(100):\n"
        "    log.write(b'line %03d ' % i + b'x' * 40 + b'\\n')\n"
    )
    with open(log, "wb") as out:
        subprocess.run(
            [sys.executable, "-c", code, os.path.dirname(sandbox_net.__file__)],
            stdout=out,
            check=True,
        )
    current, previous = log.read_bytes(), (tmp_path / "slurm-7.log.1").read_bytes()
    assert len(current) <= 1000 and len(previous) <= 1000, (len(current), len(previous))
    assert current.endswith(b"line 099 " + b"x" * 40 + b"\n")
    assert b"earlier output in" in current.splitlines()[0]


def test_the_sandbox_gets_the_descriptors_the_batch_script_opened(tmp_path):
    # bubblewrap's --ro-bind-data N reads a file from a descriptor the script opened (a
    # here-string), through the runner; the sandbox's output reaches the job's log
    folder = tmp_path / "net"
    folder.mkdir()
    done = subprocess.run(
        [
            "bash",
            "-c",
            f'exec python3 "$0" node --dir {folder} -- sh -c "cat <&7" 7<<<"from the script"',
            sandbox_net.__file__,
        ],
        env={**os.environ, "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout) == (0, "from the script\n"), done.stderr
    assert not folder.exists()  # the runner's folder goes with the job


def test_the_node_runner_needs_only_the_standard_library():
    # the nodes run it with their own python3, without the hub's packages
    runner = REPO / "hub_ext" / "slurm" / "sandbox_net.py"
    done = subprocess.run(
        ["python3", "-I", "-S", str(runner), "node"], capture_output=True, text=True
    )
    assert "a command to run is needed" in done.stderr, done.stderr


def test_the_sandbox_sees_the_hub_and_its_own_port_on_its_own_loopback():
    url = "http://10.215.15.1:8081/hub/api/users/ann/activity"
    assert sandbox_net.hub_address("http://10.215.15.1:8081/hub/api") == ("10.215.15.1", 8081)
    assert sandbox_net.with_netloc(url, "127.0.0.1", 4242) == (
        "http://127.0.0.1:4242/hub/api/users/ann/activity"
    )
    with pytest.raises(ValueError, match="JUPYTERHUB_API_URL has no host"):
        sandbox_net.hub_address("")
