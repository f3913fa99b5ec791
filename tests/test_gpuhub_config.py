"""``gpuhub config check|show`` as an operator runs them: a subprocess in a deployment's
folder, its words and its exit status (hub_ext/config_cli.py)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from jupyterhub.utils import random_port

REPO = Path(__file__).resolve().parents[1]


def gpuhub_config(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``gpuhub config ARGS`` with only ``env`` set among the GPUHUB_* variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "JUPYTERHUB_"))}
    return subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "config", *args],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def site(tmp_path) -> dict[str, str]:
    """A good deployment: its login settings, a profile list, datasets and a uid map."""
    (tmp_path / "profiles.json").write_text(
        json.dumps(
            [
                {"display_name": "CPU", "slug": "cpu", "gpus": 0},
                {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 1},
            ]
        )
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "datasets.json").write_text(
        json.dumps({"imagenet": {"path": str(tmp_path / "data"), "groups": ["vision"]}})
    )
    (tmp_path / "uids.json").write_text(json.dumps({"alice": {"uid": 2001, "gid": 2001}}))
    (tmp_path / "courses.json").write_text(
        json.dumps(
            {
                "ml101": {
                    "group": "ml101",
                    "instructors": ["ml101-instructors"],
                    "account": "course-ml101",
                }
            }
        )
    )
    return {
        "GPUHUB_STATE_DIR": str(tmp_path / "state"),
        "GPUHUB_GPUS": "simulated:2",
        "GPUHUB_OIDC_ISSUER": "https://login.example.org/realms/club",
        "GPUHUB_OIDC_CLIENT_ID": "gpuhub",
        "GPUHUB_OIDC_CLIENT_SECRET": "client-secret-value",
        "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32),
        "GPUHUB_PROFILES": str(tmp_path / "profiles.json"),
        "GPUHUB_DATASETS": str(tmp_path / "datasets.json"),
        "GPUHUB_UID_MAP": str(tmp_path / "uids.json"),
        "GPUHUB_COURSES": str(tmp_path / "courses.json"),
    }


def test_check_passes_good_settings(tmp_path, site):
    r = gpuhub_config("check", cwd=tmp_path, **site)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpuhub config check: the settings are good" in r.stdout
    assert not (tmp_path / "state").exists()  # a check writes nothing of the hub's


def _break(tmp_path: Path, what: str) -> dict[str, str]:
    if what == "datasets":
        (tmp_path / "datasets.json").write_text('{"imagenet": {"path": "/data",}')
    if what == "profiles-slug":
        (tmp_path / "profiles.json").write_text(
            json.dumps(
                [{"display_name": "CPU", "slug": "cpu"}, {"display_name": "Also", "slug": "cpu"}]
            )
        )
    if what == "uid":
        (tmp_path / "uids.json").write_text(json.dumps({"bob": {"uid": 0}}))
    return {}


@pytest.mark.parametrize(
    ("env", "broken", "words"),
    [
        pytest.param(
            {"GPUHUB_CULL_WARNING": "soon"},
            None,
            "error: GPUHUB_CULL_WARNING='soon': use 0 or a larger whole number (seconds)",
            id="bad-int",
        ),
        pytest.param(
            {"GPUHUB_HUB_PORT": "80801"},
            None,
            "error: GPUHUB_HUB_PORT=80801: use a whole number 1..65535",
            id="out-of-bounds",
        ),
        pytest.param(
            {"GPUHUB_BACKEND": "Kubernetes"},
            None,
            "error: GPUHUB_BACKEND='Kubernetes': use 'docker' or 'slurm'",
            id="unknown-choice",
        ),
        pytest.param(
            {"GPUHUB_CULL_IDEL_TIMEOUT": "600"},
            None,
            "error: GPUHUB_CULL_IDEL_TIMEOUT is not a setting of this hub and is ignored "
            "(did you mean GPUHUB_CULL_IDLE_TIMEOUT?)",
            id="typo",
        ),
        pytest.param(
            {"GPUHUB_PROFILES": "/srv/gpuhub/no-such-profiles.json"},
            None,
            "error: GPUHUB_PROFILES=/srv/gpuhub/no-such-profiles.json: [Errno 2] No such "
            "file or directory",
            id="missing-profiles",
        ),
        pytest.param(
            {},
            "profiles-slug",
            "profile_list has the slug 'cpu' twice",
            id="duplicate-profile-slug",
        ),
        pytest.param(
            {},
            "datasets",
            "datasets.json: Expecting property name enclosed in double quotes",
            id="malformed-datasets-json",
        ),
        pytest.param(
            {},
            "uid",
            "uids.json: bob: {'uid': 0} is not a valid non-root uid and gid",
            id="root-in-uid-map",
        ),
        pytest.param(
            {"GPUHUB_OIDC_CLIENT_ID": ""},
            None,
            "error: the hub's login: CreditAuthenticator needs the client id registered "
            "with the provider: set GPUHUB_OIDC_CLIENT_ID",
            id="what-apply-config-refuses",
        ),
        pytest.param(
            {"JUPYTERHUB_CRYPT_KEY": "hunter2-is-my-key"},
            None,
            "error: JUPYTERHUB_CRYPT_KEY=(a secret: not shown): use keys of 32 bytes",
            id="crypt-key-never-shown",
        ),
    ],
)
def test_check_names_what_is_wrong_and_exits_1(tmp_path, site, env, broken, words):
    if broken:
        _break(tmp_path, broken)
    r = gpuhub_config("check", cwd=tmp_path, **{**site, **env})
    assert r.returncode == 1, r.stdout + r.stderr
    assert words in r.stdout, r.stdout + r.stderr
    assert "hunter2" not in r.stdout + r.stderr
    assert "problem(s)" in r.stdout.splitlines()[-1]


def test_check_names_the_course_and_its_field(tmp_path, site):
    (tmp_path / "courses.json").write_text(
        json.dumps({"ml101": {"group": "ml101", "instructors": "ml101-instructors"}})
    )
    r = gpuhub_config("check", cwd=tmp_path, **site)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (
        f"error: GPUHUB_COURSES: {tmp_path / 'courses.json'}: course 'ml101': "
        "instructors: a non-empty list of group names"
    ) in r.stdout, r.stdout + r.stderr


def test_check_runs_the_site_additions(tmp_path, site):
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-typo.py").write_text("c.JupyterHub.template_vars['x'] = y\n")
    r = gpuhub_config("check", cwd=tmp_path, GPUHUB_CONFIG_DIR=str(tmp_path / "conf.d"), **site)
    assert r.returncode == 1
    assert f"error: site additions in {tmp_path / 'conf.d'}: name 'y' is not defined" in r.stdout


def test_show_masks_secrets_and_says_where_each_value_came_from(tmp_path, site):
    (tmp_path / ".env").write_text(
        "# written by gpuhub init\n"
        "GPUHUB_OIDC_CLIENT_SECRET='from-the-env-file'\n"
        "GPUHUB_CREDITS_ADMIN_TOKEN=admin-token-value\n"
        "GPUHUB_PORT=8443\n"
        "GPUHUB_HUB_PORT=9000\n"
    )
    env = {k: v for k, v in site.items() if k != "GPUHUB_OIDC_CLIENT_SECRET"}
    r = gpuhub_config("show", cwd=tmp_path, GPUHUB_HUB_PORT="9100", **env)
    assert r.returncode == 0, r.stderr
    lines = {
        line.split()[0]: line.split()
        for line in r.stdout.splitlines()
        if line and not line.startswith("#")
    }
    assert lines["GPUHUB_OIDC_CLIENT_SECRET"][1:] == ["********", ".env"]
    assert lines["GPUHUB_CREDITS_ADMIN_TOKEN"][1:] == ["********", ".env"]
    assert lines["JUPYTERHUB_CRYPT_KEY"][1:] == ["********", "environment"]
    assert lines["GPUHUB_PORT"][1:] == ["8443", ".env"]
    assert lines["GPUHUB_HUB_PORT"][1:] == ["9100", "environment"]  # the environment wins
    assert lines["GPUHUB_CULL_IDLE_TIMEOUT"][1:] == ["3600", "default"]
    for secret in ("from-the-env-file", "admin-token-value", site["JUPYTERHUB_CRYPT_KEY"]):
        assert secret not in r.stdout + r.stderr


def test_check_names_each_env_file_value_the_environment_overrides(tmp_path, site):
    """docker-compose.yml's environment: pins GPUHUB_PORT: the .env file's value is never
    the hub's, and check says so instead of passing on the pinned one."""
    (tmp_path / ".env").write_text(
        "GPUHUB_PORT=eighty\nGPUHUB_OIDC_CLIENT_SECRET=from-the-env-file\nGPUHUB_HUB_PORT=8081\n"
    )
    env = {**site, "GPUHUB_PORT": "8000", "GPUHUB_HUB_PORT": "8081"}
    r = gpuhub_config("check", cwd=tmp_path, **env)
    assert r.returncode == 1, r.stdout
    assert (
        "error: GPUHUB_PORT='eighty' in .env has no effect: the hub's environment sets '8000' "
        "(docker-compose.yml's environment: pins it, or the hub's container was made before "
        "the file changed; docs: reference/compose)"
    ) in r.stdout
    assert (
        "error: GPUHUB_OIDC_CLIENT_SECRET in .env has no effect: the hub's environment sets "
        "another value"
    ) in r.stdout
    assert "GPUHUB_HUB_PORT" not in r.stdout  # the same value: nothing to say
    assert "from-the-env-file" not in r.stdout and site["GPUHUB_OIDC_CLIENT_SECRET"] not in r.stdout


def test_show_reads_the_env_file_it_is_given(tmp_path, site):
    (tmp_path / "prod.env").write_text("GPUHUB_BACKEND=slurm\n")
    r = gpuhub_config("show", "--env-file", "prod.env", cwd=tmp_path, **site)
    assert r.returncode == 0, r.stderr
    assert any(
        line.split() == ["GPUHUB_BACKEND", "slurm", "prod.env"] for line in r.stdout.splitlines()
    )
    r = gpuhub_config("show", "--env-file", "missing.env", cwd=tmp_path, **site)
    assert r.returncode == 1 and "missing.env" in r.stderr


def test_check_reach_asks_the_provider_the_credits_api_and_docker(
    tmp_path, site, oidc_provider, credits_service
):
    env = {
        **site,
        "GPUHUB_OIDC_ISSUER": oidc_provider.url,
        "GPUHUB_CREDITS_URL": credits_service.url,
        "GPUHUB_CREDITS_TOKEN": credits_service.hub_token,
    }
    r = gpuhub_config("check", "--reach", cwd=tmp_path, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ok: the OIDC provider's discovery document ({oidc_provider.url}" in r.stdout
    assert f"ok: the Credits API ({credits_service.url}) accepts the hub's token" in r.stdout
    assert "ok: the Docker engine" in r.stdout

    nobody = f"http://127.0.0.1:{random_port()}"
    r = gpuhub_config(
        "check",
        "--reach",
        cwd=tmp_path,
        **{**env, "GPUHUB_OIDC_ISSUER": nobody, "GPUHUB_CREDITS_TOKEN": "not-the-token"},
    )
    assert r.returncode == 1
    assert f"error: GPUHUB_OIDC_ISSUER: {nobody}/.well-known/openid-configuration:" in r.stdout
    assert (
        f"error: GPUHUB_CREDITS_TOKEN: the Credits API at {credits_service.url} refused it (401)"
    ) in r.stdout
    assert "not-the-token" not in r.stdout


def test_check_reach_tells_a_wrong_client_secret(tmp_path, site, oidc_provider):
    """A made-up code at the token endpoint: 400 invalid_grant with the right client secret,
    401 invalid_client with a wrong one (or one sent the way the provider does not take)."""
    client_id, secret = oidc_provider.register_client("https://hub.example/hub/oauth_callback")
    env = {
        **site,
        "GPUHUB_OIDC_ISSUER": oidc_provider.url,
        "GPUHUB_OIDC_CLIENT_ID": client_id,
        "GPUHUB_OIDC_CLIENT_SECRET": secret,
    }
    r = gpuhub_config("check", "--reach", cwd=tmp_path, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "ok: the OIDC provider accepts the hub's client id and secret (client_secret_basic)"
        in r.stdout
    )

    for wrong in (
        {"GPUHUB_OIDC_CLIENT_SECRET": "not-the-secret"},
        {"GPUHUB_OIDC_TOKEN_AUTH": "client_secret_post"},
    ):
        r = gpuhub_config("check", "--reach", cwd=tmp_path, **{**env, **wrong})
        assert r.returncode == 1, r.stdout + r.stderr
        assert (
            "error: GPUHUB_OIDC_CLIENT_SECRET: the provider's token endpoint refused the hub's "
            f"client id {client_id!r} and its secret (401 invalid_client" in r.stdout
        ), r.stdout
        assert "not-the-secret" not in r.stdout and secret not in r.stdout


@pytest.mark.slurm
def test_check_reach_asks_slurms_controller(tmp_path, site, slurm_cluster):
    env = {
        **site,
        "GPUHUB_BACKEND": "slurm",
        "GPUHUB_SLURM_CONF": str(slurm_cluster.dir / "slurm.conf"),
    }
    r = gpuhub_config(
        "check",
        "--reach",
        cwd=tmp_path,
        **{**env, "GPUHUB_OIDC_ISSUER": f"http://127.0.0.1:{random_port()}"},
    )
    assert "ok: Slurm's controller (Slurmctld(primary) at" in r.stdout, r.stdout + r.stderr
    assert "Docker" not in r.stdout  # only what the settings use

    r = gpuhub_config(
        "check",
        "--reach",
        cwd=tmp_path,
        **{
            **env,
            "GPUHUB_OIDC_ISSUER": f"http://127.0.0.1:{random_port()}",
            "GPUHUB_SLURM_SUBMIT_HOST": "gpuhub@127.0.0.1",
            "GPUHUB_SLURM_SSH_OPTIONS": f"-p {random_port()} -o ConnectTimeout=2",
        },
    )
    assert r.returncode == 1
    assert "error: Slurm's controller does not answer (scontrol ping):" in r.stdout


#: profiles no machine here can hold, with the words that name them (``{where}``: the
#: backend's own, "this machine" or "the nodes of partition gpu")
NEVER = [
    {"display_name": "Huge", "slug": "huge", "spawner_override": {"mem_limit": "4096G"}},
    {
        "display_name": "Choose",
        "slug": "choose",
        "gpus": 1,
        "profile_options": {
            "gpus": {
                "choices": {
                    "1": {"default": True, "spawner_override": {"gpus": 1}},
                    "8": {"spawner_override": {"gpus": 8}},
                }
            }
        },
    },
]


def never_starts(stdout: str, where: str, here: str) -> None:
    assert re.search(
        rf"error: profile 'huge' can never start {here}: it asks for 4096 GB of memory "
        rf"\(at most [\d.]+ GB on {where}\)",
        stdout,
    ), stdout
    assert (
        f"error: profile 'choose (gpus: 8)' can never start {here}: it asks for 8 GPUs "
        f"(at most 2 on {where})"
    ) in stdout, stdout
    assert "profile 'cpu'" not in stdout and "'choose'" not in stdout


def test_check_reach_names_each_profile_that_can_never_start_on_this_machine(
    tmp_path, site, oidc_provider
):
    env = {**site, "GPUHUB_OIDC_ISSUER": oidc_provider.url}
    (tmp_path / "profiles.json").write_text(json.dumps([{"display_name": "CPU", "slug": "cpu"}]))
    r = gpuhub_config("check", "--reach", cwd=tmp_path, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"ok: every profile fits this machine \(\d+ MiB, \d+ CPUs, 2 GPUs\)", r.stdout)
    # the built-in profiles, with the limits the hub gives them, fit too
    r = gpuhub_config("check", "--reach", cwd=tmp_path, **{**env, "GPUHUB_PROFILES": ""})
    assert r.returncode == 0 and "ok: every profile fits" in r.stdout, r.stdout + r.stderr

    (tmp_path / "profiles.json").write_text(
        json.dumps([{"display_name": "CPU", "slug": "cpu"}, *NEVER])
    )
    r = gpuhub_config("check", "--reach", cwd=tmp_path, **env)
    assert r.returncode == 1
    never_starts(r.stdout, "this machine", "here")


@pytest.mark.slurm
def test_check_reach_names_each_profile_no_node_of_its_partition_can_hold(
    tmp_path, site, oidc_provider, slurm_cluster
):
    env = {
        **site,
        "GPUHUB_OIDC_ISSUER": oidc_provider.url,
        "GPUHUB_BACKEND": "slurm",
        "GPUHUB_SLURM_CONF": str(slurm_cluster.dir / "slurm.conf"),
    }
    r = gpuhub_config("check", "--reach", cwd=tmp_path, **{**env, "GPUHUB_PROFILES": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: every profile fits a node of the cluster (2 nodes)" in r.stdout

    other = {
        "display_name": "Other",
        "slug": "other",
        "spawner_override": {"req_partition": "a100"},
    }
    (tmp_path / "profiles.json").write_text(
        json.dumps([{"display_name": "CPU", "slug": "cpu"}, *NEVER, other])
    )
    r = gpuhub_config("check", "--reach", cwd=tmp_path, **env)
    assert r.returncode == 1
    never_starts(r.stdout, "the nodes of partition gpu", "on the cluster")
    assert (
        "error: profile 'other' can never start on the cluster: it asks for the partition "
        "'a100', which the cluster does not have"
    ) in r.stdout


def test_check_takes_a_slurm_profiles_own_keys_and_refuses_them_on_docker(tmp_path, site):
    """A profile's req_partition is the Slurm spawner's (docs/howto/slurm.md), an unknown
    key on the Docker backend: the check reads the list as the backend's spawner does."""
    (tmp_path / "profiles.json").write_text(
        json.dumps(
            [
                {"display_name": "CPU", "slug": "cpu", "gpus": 0},
                {
                    "display_name": "A100",
                    "slug": "a100",
                    "gpus": 1,
                    "spawner_override": {"req_partition": "a100"},
                },
            ]
        )
    )
    slurm = gpuhub_config("check", cwd=tmp_path, **site, GPUHUB_BACKEND="slurm")
    assert slurm.returncode == 0, slurm.stdout + slurm.stderr
    docker = gpuhub_config("check", cwd=tmp_path, **site)
    assert docker.returncode == 1
    assert "profile override keys not supported here: req_partition" in docker.stdout
