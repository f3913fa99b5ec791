"""The production deployment, docker-compose.yml, brought up and used as an admin and members
would: log in, spawn a GPU server, work in it, pay for it; restart the hub; take the stack
down and up; back up and restore both databases; migrate; keep secrets secret.

One stack serves the module (``stack`` fixture, ``conftest.py``); the tests run in file
order and each leaves it running with no server.
"""

from __future__ import annotations

import re
import secrets
import ssl
import subprocess
import textwrap
import time
from decimal import Decimal

import psycopg
import pytest

from hub_ext.credits.db import head_revision
from hub_ext.ops.deploy import SECRETS
from tests.compose.conftest import HUB_IMAGE, HUB_UID, PROBE, PROBE_RE, REPO, make_certificate
from tests.fixtures.hub import terminal_run

pytestmark = [pytest.mark.docker, pytest.mark.compose]

# the default profiles (hub_ext.config.DEFAULT_PROFILES): pytorch is 1 GPU at 1 credit per
# hour, paid per 15-minute interval when it begins
GPU_PROFILE, INTERVAL_PRICE = "pytorch", Decimal("0.25")


async def probe(hub, user: str, token: str) -> tuple[str, int]:
    """NVIDIA_VISIBLE_DEVICES and uid inside the member's server, through its terminal."""
    out = await terminal_run(hub, user, token, PROBE, expect=":END")
    devices, uid = PROBE_RE.findall(out)[-1]
    return devices, int(uid)


async def ledger(stack, user: str) -> list[tuple[str, str]]:
    async with stack.credits() as admin:
        return [(t.kind, str(t.amount)) async for t in admin.iter_transactions(user)][::-1]


async def balance(stack, user: str) -> Decimal:
    async with stack.credits() as admin:
        return (await admin.balance(user)).balance


def member_env(docker_client, container_id: str) -> str:
    return "\n".join(docker_client.inspect_container(container_id)["Config"]["Env"])


# -- the journey ------------------------------------------------------------------------------


async def test_member_logs_in_spawns_a_gpu_server_works_and_pays(stack, hub, docker_client):
    token = await hub.login("alice")
    assert await balance(stack, "alice") == Decimal("10")  # GPUHUB_INITIAL_CREDITS, at login

    r = await hub.spawn("alice", token, GPU_PROFILE)
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice", token)

    devices, uid = await probe(hub, "alice", token)
    assert re.fullmatch(r"GPU-[0-9a-f-]+", devices), devices
    assert uid != 0
    [container] = stack.members(docker_client)
    assert container["Labels"]["io.gpuhub.devices"] == devices
    # the server gets its own API token and none of the deployment's secrets
    env = member_env(docker_client, container["Id"])
    for name, value in stack.secrets().items():
        assert value not in env, f"{name} reached alice's server"

    assert await balance(stack, "alice") == Decimal("10") - INTERVAL_PRICE
    assert await ledger(stack, "alice") == [("grant", "10.00"), ("debit", str(INTERVAL_PRICE))]
    assert (await hub.availability(token))["allocated"] == 1

    await hub.stop("alice", token)
    assert stack.members(docker_client) == []
    assert (await hub.availability(token))["free"] == 2
    # the unused part of the interval comes back
    kinds = [kind for kind, _ in await ledger(stack, "alice")]
    assert kinds == ["grant", "debit", "refund"]
    assert await balance(stack, "alice") > Decimal("10") - INTERVAL_PRICE


def test_hub_container_sees_gpus_for_nvml_only_and_docker_as_a_group_member(stack):
    hub = stack.container("hub")
    assert hub["HostConfig"]["DeviceRequests"] == [
        {
            "Driver": "nvidia",
            "Count": -1,
            "DeviceIDs": [],
            "Capabilities": [["utility"]],
            "Options": {},
        }
    ]
    assert hub["Config"]["User"] == f"{HUB_UID}:{HUB_UID}"
    assert hub["HostConfig"]["GroupAdd"] == [stack.env()["GPUHUB_DOCKER_GID"]]
    assert "/var/run/docker.sock:/var/run/docker.sock:rw" in hub["HostConfig"]["Binds"]


async def test_hub_restart_keeps_servers_and_their_gpus(stack, hub, docker_client):
    bob = await hub.login("bob")
    r = await hub.spawn("bob", bob, GPU_PROFILE)
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("bob", bob)
    bobs_gpu, _ = await probe(hub, "bob", bob)
    [before] = stack.members(docker_client)
    started = docker_client.inspect_container(before["Id"])["State"]["StartedAt"]

    stack.compose("restart", "-t", "10", "hub")
    stack.wait_ready()

    # the same container, never restarted, still served through the (new) proxy
    [after] = stack.members(docker_client)
    assert after["Id"] == before["Id"]
    assert docker_client.inspect_container(after["Id"])["State"]["StartedAt"] == started
    assert (await hub.api("GET", "/users/bob", bob)).json()["servers"][""]["ready"]
    assert (await probe(hub, "bob", bob))[0] == bobs_gpu
    # and its GPU is still bob's: one allocated, the other goes to carol, then none is free
    assert (await hub.availability(bob))["allocated"] == 1
    carol = await hub.login("carol")
    r = await hub.spawn("carol", carol, GPU_PROFILE)
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("carol", carol)
    carols_gpu, _ = await probe(hub, "carol", carol)
    assert carols_gpu != bobs_gpu
    dave = await hub.login("dave")
    r = await hub.spawn("dave", dave, GPU_PROFILE)
    assert r.status_code >= 400 and "No GPU free" in r.json()["message"], r.text

    await hub.stop("bob", bob)
    await hub.stop("carol", carol)


def test_databases_have_separate_roles_and_want_passwords(stack):
    s = stack.secrets()

    def connect(user, db, password=None):
        return psycopg.connect(
            host="127.0.0.1",
            port=stack.pg_port,
            user=user,
            dbname=db,
            password=password,
            connect_timeout=10,
        )

    with connect("hub", "jupyterhub", s["GPUHUB_DB_PASSWORD"]) as conn:
        assert conn.execute("SELECT count(*) FROM users").fetchone()[0] >= 1
    with connect("credits", "credits", s["GPUHUB_CREDITS_DB_PASSWORD"]) as conn:
        assert conn.execute("SELECT count(*) FROM accounts").fetchone()[0] >= 1
    refused = [
        ("hub", "credits", s["GPUHUB_DB_PASSWORD"]),  # not its database
        ("credits", "jupyterhub", s["GPUHUB_CREDITS_DB_PASSWORD"]),
        ("postgres", "postgres", None),  # loopback is not trusted
        ("hub", "jupyterhub", s["GPUHUB_CREDITS_DB_PASSWORD"]),
    ]
    for user, db, password in refused:
        with pytest.raises(psycopg.OperationalError):
            connect(user, db, password).close()


# -- operations -------------------------------------------------------------------------------


async def test_down_and_up_keep_the_databases_and_the_workspaces(stack, hub, docker_client):
    erin = await hub.login("erin")
    r = await hub.spawn("erin", erin, "cpu")
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("erin", erin)
    note = secrets.token_hex(8)
    await terminal_run(
        hub, "erin", erin, f"echo {note} > ~/work/note.txt && echo WROTE-OK", expect="WROTE-OK"
    )
    await hub.stop("erin", erin)
    books = await ledger(stack, "erin")

    stack.save_logs()
    stack.compose("down", "-t", "10")
    assert stack.compose("ps", "-q").stdout.strip() == b""
    stack.up()

    # the hub database: erin and her token; the ledger: her account, entry for entry
    r = await hub.api("GET", "/user", erin)
    assert r.status_code == 200 and r.json()["name"] == "erin"
    assert await ledger(stack, "erin") == books
    # the workspace
    r = await hub.spawn("erin", erin, "cpu")
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("erin", erin)
    out = await terminal_run(hub, "erin", erin, "cat ~/work/note.txt", expect=note)
    assert note in out
    await hub.stop("erin", erin)


async def test_backup_and_restore_both_databases(stack, hub, tmp_path):
    """docs/howto/upgrades-backups.md: pg_dump both databases, lose the volume, pg_restore them."""
    erin = await hub.login("erin")
    books = await ledger(stack, "erin")
    dumps = {}
    for db in ("jupyterhub", "credits"):
        dumps[db] = tmp_path / f"{db}.dump"
        dumps[db].write_bytes(
            stack.compose("exec", "-T", "postgres", "pg_dump", "-U", "postgres", "-Fc", db).stdout
        )

    stack.save_logs()
    stack.compose("down", "-v", "-t", "10")  # the databases' volume is gone
    stack.up("postgres")
    for db in ("jupyterhub", "credits"):
        with open(dumps[db], "rb") as dump:
            stack.compose(
                "exec",
                "-T",
                "postgres",
                "pg_restore",
                "-U",
                "postgres",
                "--clean",
                "--if-exists",
                "-d",
                db,
                stdin=dump,
            )
    stack.up()

    r = await hub.api("GET", "/user", erin)
    assert r.status_code == 200 and r.json()["name"] == "erin"
    assert await ledger(stack, "erin") == books


def test_upgrade_one_shot_migrates_both_databases(stack):
    r = stack.compose("run", "--rm", "-T", "upgrade")
    out = r.stdout.decode()
    assert re.search(
        r"hub database postgresql\+psycopg://hub:\*\*\*@127\.0\.0\.1:\d+/jupyterhub:"
        r" up to date \(revision \w+\)",
        out,
    ), out
    assert re.search(
        r"credits ledger postgresql\+psycopg://credits:\*\*\*@127\.0\.0\.1:\d+/"
        rf"credits: up to date \(revision {head_revision()}\)",
        out,
    ), out


# -- the operator's commands, as the docs write them ------------------------------------------


def doc_block(page: str, heading: str) -> str:
    """The first ```bash block after ``heading`` in ``docs/<page>``: the commands an
    operator copies."""
    text = (REPO / "docs" / page).read_text()
    assert heading in text, f"{page} has no {heading!r}"
    after = text.split(heading, 1)[1]
    match = re.search(r"```bash\n(.*?)```", after, re.S)
    assert match, f"no bash block after {heading!r} in {page}"
    return textwrap.dedent(match.group(1))


def test_check_reads_the_edited_env_while_the_hub_runs(stack):
    """docker-compose run --rm check: .env as edited, beside the running hub (`run --rm hub`
    is refused while it runs; `exec hub` reads the environment it was made with)."""
    original = stack.env_file.read_text()
    stack.set_env(GPUHUB_CULL_IDEL_TIMEOUT="600", GPUHUB_PORT="eighty")
    try:
        r = stack.compose("run", "--rm", "-T", "check", check=False)
        out = r.stdout.decode()
        assert r.returncode == 1, out + r.stderr.decode()
        assert "GPUHUB_CULL_IDEL_TIMEOUT is not a setting of this hub and is ignored " in out
        assert "(did you mean GPUHUB_CULL_IDLE_TIMEOUT?)" in out
        assert (
            "error: GPUHUB_PORT='eighty' in /etc/gpuhub/env has no effect: the hub's "
            "environment sets"
        ) in out
    finally:
        with open(stack.env_file, "r+") as f:  # in place: its mode stays
            f.truncate()
            f.write(original)
    r = stack.compose("run", "--rm", "-T", "check", check=False)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert "ok: the OIDC provider accepts the hub's client id and secret" in out
    assert "ok: every profile fits this machine" in out
    assert "gpuhub config check: the settings are good and every service answers" in out
    for value in stack.secrets().values():
        assert value not in out


def test_the_documented_backup_makes_dumps_only_their_owner_reads(stack, tmp_path):
    script = doc_block("howto/upgrades-backups.md", "## Backups")
    assert "pg_dump" in script
    r = stack.shell(script)
    assert r.returncode == 0, r.stderr
    for db in ("jupyterhub", "credits"):
        dump = stack.dir / "backups" / f"{db}.dump"
        assert dump.stat().st_size > 0, db
        assert dump.stat().st_mode & 0o777 == 0o600, oct(dump.stat().st_mode)
    assert (stack.dir / "backups").stat().st_mode & 0o777 == 0o700


async def test_the_documented_credits_command_runs_in_the_hubs_container(stack):
    """The tutorial's "Next": a `gpuhub credits` command on a compose deployment."""
    tutorial = (REPO / "docs" / "tutorial" / "first-hub.md").read_text()
    [command] = re.findall(r"`(docker-compose [^`]*gpuhub credits grant alice[^`]*)`", tutorial)
    r = stack.shell(command.replace("docker-compose exec", "docker-compose exec -T"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Granted 100.00 credits to alice" in r.stdout
    async with stack.credits() as admin:
        assert (await admin.balance("alice")).balance >= Decimal("100")


def test_a_renewed_certificate_is_served_after_the_documented_steps(stack, tmp_path):
    before = ssl.get_server_certificate(("127.0.0.1", int(stack.ports["GPUHUB_TEST_PORT"])))
    renewed = make_certificate(tmp_path)
    script = doc_block("howto/tls-reverse-proxy.md", "## Renew the certificate")
    script = script.replace("/path/fullchain.pem", str(renewed / "cert.pem"))
    script = script.replace("/path/privkey.pem", str(renewed / "key.pem"))
    r = stack.shell(script)
    assert r.returncode == 0, r.stderr
    stack.wait_ready()  # trusts tls/cert.pem: the renewed one
    served = ssl.get_server_certificate(("127.0.0.1", int(stack.ports["GPUHUB_TEST_PORT"])))
    assert served.strip() == (renewed / "cert.pem").read_text().strip()
    assert served != before
    key = stack.dir / "tls" / "key.pem"
    assert (key.stat().st_uid, key.stat().st_mode & 0o777) == (HUB_UID, 0o600)


def test_hub_refuses_to_start_while_env_is_readable_by_others(stack):
    stack.env_file.chmod(0o644)
    try:
        stack.compose("restart", "-t", "10", "hub")
        deadline = time.monotonic() + 60
        while "chmod 600" not in stack.logs("hub"):
            assert time.monotonic() < deadline, stack.logs("hub")[-3000:]
            time.sleep(0.5)
        assert "/etc/gpuhub/env (GPUHUB_SECRET_FILES) holds secrets" in stack.logs("hub")
        with pytest.raises(Exception):  # noqa: B017 - the hub does not answer at all
            stack.wait_ready(timeout=3)
    finally:
        stack.env_file.chmod(0o600)
    stack.compose("restart", "-t", "10", "hub")
    stack.wait_ready()


# -- secrets ----------------------------------------------------------------------------------


def test_no_secret_in_the_logs(stack):
    logs = "\n".join(stack.saved_logs + [stack.logs()])
    assert "Hub API listening" in logs and "Credits service listening" in logs
    for name, value in stack.secrets().items():
        assert value not in logs, f"{name} is in the logs"


@pytest.mark.parametrize("image", [HUB_IMAGE, "postgres:15-bookworm"])
def test_no_secret_in_the_images(stack, docker_client, image):
    """Neither the values of this deployment's secrets nor any setting of a secret variable."""
    history = subprocess.run(
        ["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    config = docker_client.inspect_image(image)["Config"]
    env_names = {line.split("=", 1)[0] for line in config["Env"] or []}
    assert not env_names & set(SECRETS), env_names & set(SECRETS)
    for name, value in stack.secrets().items():
        assert value not in history and value not in str(config), name
        assert f"{name}=" not in history, f"{name} is set in a layer of {image}"
