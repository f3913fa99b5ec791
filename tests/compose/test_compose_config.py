"""docker-compose.yml as docker-compose reads it: valid, secrets only by reference, the images
the build script makes.  No Docker engine is needed (``docker-compose config`` only parses),
so these run wherever docker-compose is installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from hub_ext.ops.deploy import SECRETS
from tests.compose.conftest import OVERRIDE, PORTS, REPO, docker_compose

pytestmark = pytest.mark.compose

PRODUCTION = REPO / "docker-compose.yml"
#: variables whose values are secrets: the ones `gpuhub init` writes, and what they become
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|_SECRET$|CRYPT_KEY")


@pytest.fixture
def project(tmp_path):
    """A project folder like an admin's clone, with the .env of `gpuhub init`."""
    (tmp_path / "docker-compose.yml").symlink_to(PRODUCTION)
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    r = subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "init", "--env-file", str(tmp_path / ".env")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return tmp_path


def config(project, *files, env=None) -> subprocess.CompletedProcess:
    args = [docker_compose(), "--project-directory", str(project)]
    for f in files or (project / "docker-compose.yml",):
        args += ["-f", str(f)]
    return subprocess.run(
        [*args, "config"], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def test_production_file_validates_with_the_env_of_gpuhub_init(project):
    r = config(project)
    assert r.returncode == 0, r.stderr
    services = yaml.safe_load(r.stdout)["services"]
    assert set(services) == {"pod", "postgres", "credits", "hub", "check", "upgrade"}
    assert services["credits"]["profiles"] == ["credits"]
    assert services["upgrade"]["profiles"] == ["upgrade"]
    assert services["check"]["profiles"] == ["check"]
    # hub, credits and postgres share the pod's namespace; only the pod is on the network
    for name in ("postgres", "credits", "hub", "check", "upgrade"):
        assert services[name]["network_mode"] == "service:pod", name
    hub = services["hub"]
    assert hub["environment"]["GPUHUB_DOCKER_NETWORK"] == "gpuhub"
    # pod at the address the network's rules trust: the default subnet's .2
    # (deploy/network/gpuhub-network.sh)
    assert services["pod"]["networks"]["default"]["ipv4_address"] == "172.31.255.2"
    script = (REPO / "deploy" / "network" / "gpuhub-network.sh").read_text()
    assert 'SUBNET="${GPUHUB_NETWORK_SUBNET:-172.31.255.0/24}"' in script
    assert hub["group_add"] == [str(os.stat("/var/run/docker.sock").st_gid)]


def test_the_check_service_sees_what_the_hub_sees(project):
    """`docker-compose run --rm check` checks .env as edited with everything the hub's own
    container gets: its pinned environment, files, Docker access and GPUs."""
    services = yaml.safe_load(config(project).stdout)["services"]
    hub, check = services["hub"], services["check"]
    for key in ("image", "environment", "group_add", "volumes", "deploy"):  # with .env
        assert check[key] == hub[key], key
    assert check["entrypoint"] == ["gpuhub", "config", "check", "--env-file", "/etc/gpuhub/env"]
    assert check["command"] == ["--reach"]
    assert "/etc/gpuhub/env" in {v.split(":")[1] for v in hub["volumes"]}


def test_the_reference_names_every_setting_compose_pins():
    """docs/reference/compose.md lists each variable the hub's `environment:` sets: a .env
    value for one of them never reaches the hub (`gpuhub config check` says so too)."""
    pinned = yaml.safe_load(PRODUCTION.read_text())["services"]["hub"]["environment"]
    page = (REPO / "docs" / "reference" / "compose.md").read_text()
    section = page.split("## What docker-compose.yml pins", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(GPUHUB_[A-Z_]+)` \|", section, re.MULTILINE))
    assert listed == set(pinned), set(pinned) ^ listed


def test_no_page_tells_operators_to_run_a_second_hub_container():
    """`docker-compose run --rm hub ...` is refused while the hub runs (compose links a
    one-off container to the running one, which network_mode service:pod does not allow),
    and `exec hub gpuhub config check` reads the environment the hub was made with."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:  # the commands operators copy: the pages' code blocks
        for block in re.findall(r"```(?:bash|console)\n(.*?)```", page.read_text(), re.S):
            assert "docker-compose run --rm hub" not in block, page
            assert "exec hub gpuhub config check" not in block, page
    for page in ("tutorial/first-hub.md", "howto/upgrades-backups.md", "reference/settings.md"):
        assert "docker-compose run --rm check" in (REPO / "docs" / page).read_text(), page


def test_a_missing_secret_stops_compose_naming_it(project):
    env = project / ".env"
    env.write_text(
        "".join(
            line
            for line in env.read_text().splitlines(keepends=True)
            if not line.startswith("GPUHUB_DB_PASSWORD=")
        )
    )
    r = config(project)
    assert r.returncode != 0
    assert "GPUHUB_DB_PASSWORD" in r.stderr and "run gpuhub init" in r.stderr, r.stderr


def test_secrets_appear_only_as_references():
    """Every secret-looking variable of every service is exactly a ${VAR...} reference."""
    raw = yaml.safe_load(PRODUCTION.read_text())
    checked = 0
    for name, service in raw["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                assert re.fullmatch(r"\$\{[A-Z_]+(:\?[^}]*)?\}", str(value)), (name, key, value)
                checked += 1
    assert checked >= 6
    # and what gpuhub init writes is the only source: each secret is referenced somewhere
    text = PRODUCTION.read_text()
    for name in set(SECRETS) - {"JUPYTERHUB_CRYPT_KEY", "JPY_COOKIE_SECRET"}:
        assert "${" + name + ":?" in text, name


def test_images_are_the_ones_the_build_script_makes(project):
    images = {s["image"] for s in yaml.safe_load(config(project).stdout)["services"].values()}
    script = (REPO / "scripts" / "build-images.sh").read_text()
    postgres = re.search(r"^POSTGRES_IMAGE=(\S+)$", script, re.MULTILINE).group(1)
    assert images == {"gpuhub/hub:latest", postgres}
    env = {name: "12345" for name in PORTS} | {"GPUHUB_TEST_HUB_IMAGE": "gh-x/hub:latest"}
    tested = config(project, project / "docker-compose.yml", OVERRIDE, env=env)
    images = {s["image"] for s in yaml.safe_load(tested.stdout)["services"].values()}
    assert images == {"gh-x/hub:latest", postgres}  # the tests run this tree's own


def test_test_override_puts_every_started_service_on_host_networking(project):
    env = {name: "12345" for name in PORTS}
    r = config(project, project / "docker-compose.yml", OVERRIDE, env=env)
    assert r.returncode == 0, r.stderr
    services = yaml.safe_load(r.stdout)["services"]
    assert services.pop("pod")["profiles"] == ["bridge-networks-only"]  # never started
    for name, service in services.items():
        assert service["network_mode"] == "host", name
    assert services["hub"]["environment"]["GPUHUB_DOCKER_NETWORK"] == "host"
