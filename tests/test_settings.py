"""Every setting declared once (hub_ext/settings.py, hub_ext/settings/rows.py): the hub's
start, its site additions, the credits CLI and the reference page all follow the rows."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import signal
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from jupyterhub.utils import random_port

from hub_ext.settings import (
    NOT_SETTINGS,
    SettingError,
    Settings,
    declared,
    from_env,
    setting,
)
from hub_ext.settings import rows as settings_rows

REPO = Path(__file__).resolve().parents[1]


def hub_env(tmp_path: Path, **env: str) -> dict[str, str]:
    """A hub's environment with only these settings besides a minimal good set."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "JUPYTERHUB_"))}
    return {
        **base,
        "PYTHONPATH": str(REPO),
        "GPUHUB_STATE_DIR": str(tmp_path / "state"),
        "GPUHUB_GPUS": "simulated:1",
        "GPUHUB_OIDC_ISSUER": "https://login.example.org",
        "GPUHUB_OIDC_CLIENT_ID": "gpuhub",
        "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32),
        **env,
    }


def jupyterhub(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """JupyterHub itself on the shipped jupyterhub_config.py, on ports of its own; a hub
    that does not exit within 60 s is stopped with everything it started."""
    ports = {
        k: str(random_port())
        for k in ("GPUHUB_PORT", "GPUHUB_HUB_PORT", "GPUHUB_PROXY_API_PORT", "GPUHUB_CREDITS_PORT")
    }
    argv = [sys.executable, "-m", "jupyterhub", "-f", str(REPO / "jupyterhub_config.py"), *args]
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=hub_env(tmp_path, **{**ports, **env}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the hub stops its proxy and services on SIGTERM
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"jupyterhub did not exit:\n{err[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


# -- the hub -----------------------------------------------------------------------------------


def test_the_hub_refuses_to_start_on_malformed_values_naming_each(tmp_path):
    r = jupyterhub(
        tmp_path,
        GPUHUB_CULL_MAX_AGE="8 hours",
        GPUHUB_SLURM_ACCOUNTING="yes",
        GPUHUB_CREDITS_DB_PASSWORD="pw",
    )
    assert r.returncode == 1
    assert r.stderr.splitlines()[-2:] == [
        "GPUHUB_CULL_MAX_AGE='8 hours': use 0 or a larger whole number (seconds)",
        "GPUHUB_SLURM_ACCOUNTING='yes': use 'auto', 'on' or 'off'",
    ]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "state").exists()  # stopped before anything was made


def test_site_additions_run_after_the_hubs_configuration_with_its_c(tmp_path):
    """JupyterHub's own loader (``--show-config`` loads the configuration and exits)."""
    site = tmp_path / "site.d"
    site.mkdir()
    (site / "20-second.py").write_text("c.JupyterHub.template_vars['order'].append('20')\n")
    (site / "10-first.py").write_text(
        "assert 'gpuhub_notices' in c.JupyterHub.template_vars  # the hub's own ran first\n"
        "c.JupyterHub.template_vars['order'] = ['10']\n"
        "c.JupyterHub.named_server_limit_per_user = 7\n"
    )
    (site / "notes.txt").write_text("not python")
    r = jupyterhub(
        tmp_path, "--show-config", GPUHUB_CONFIG_DIR=str(site), GPUHUB_CULL_IDEL_TIMEOUT="60"
    )
    assert r.returncode == 0, r.stderr
    assert "'order': ['10', '20']" in r.stdout
    assert re.search(r"\.named_server_limit_per_user = 7\b", r.stdout)
    assert (
        "GPUHUB_CULL_IDEL_TIMEOUT is not a setting of this hub and is ignored (did you "
        "mean GPUHUB_CULL_IDLE_TIMEOUT?)"
    ) in r.stderr


def test_a_missing_site_folder_that_was_named_stops_the_hub(tmp_path):
    r = jupyterhub(tmp_path, "--show-config", GPUHUB_CONFIG_DIR=str(tmp_path / "nope"))
    assert r.returncode == 1
    assert f"GPUHUB_CONFIG_DIR names {tmp_path / 'nope'}, which is not a folder" in r.stderr


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        pytest.param("GPUHUB_CREDITS", " OFF ", False, id="switch-words-any-case"),
        pytest.param("GPUHUB_BACKEND", "Slurm", "slurm", id="choice-any-case"),
        pytest.param("GPUHUB_IP", "", "", id="empty-ip-is-every-interface"),
        pytest.param("GPUHUB_PORT", "", 8000, id="empty-is-the-default"),
        pytest.param("GPUHUB_ACTIVE_SERVER_LIMIT", "0", 0, id="zero-is-no-limit"),
    ],
)
def test_values_parse_as_declared(tmp_path, name, text, value):
    settings = from_env(hub_env(tmp_path, **{name: text}))
    assert getattr(settings, setting(name).attr) == value


def test_settings_keep_their_attributes_and_defaults():
    s = Settings()
    assert (s.port, s.credits, s.active_server_limit, s.slurm_accounting) == (
        8000,
        True,
        None,
        "auto",
    )
    assert s.state_dir == REPO / "var"
    assert "hunter2" not in repr(Settings(oidc_client_secret="hunter2"))  # logs show no secret
    with pytest.raises(SettingError, match="GPUHUB_GPUS='gpu0': use 'nvml'"):
        Settings.from_env({"GPUHUB_GPUS": "gpu0"})


def test_a_long_value_is_cut_in_the_message():
    with pytest.raises(SettingError) as e:
        from_env({"GPUHUB_CREDITS_URL": "ftp://" + "x" * 200})
    assert f"GPUHUB_CREDITS_URL='ftp://{'x' * 34}...': must start with http" in str(e.value)
    assert "x" * 41 not in str(e.value)


def test_scripts_variables_are_not_taken_for_typos():
    from hub_ext.settings import unknown_variables

    assert unknown_variables(
        [
            "GPUHUB_SLURM_DIR",
            "GPUHUB_TEST_IMAGE",
            "GPUHUB_PORT",
            "GPUHUB_SLURM_PARTITON",
            "GPUHUB_NONSENSE",
        ]
    ) == {"GPUHUB_SLURM_PARTITON": "GPUHUB_SLURM_PARTITION", "GPUHUB_NONSENSE": None}


def test_every_variable_the_code_names_is_declared():
    """A module that starts reading a new GPUHUB_* variable must declare it."""
    named = set()
    for path in [*REPO.glob("hub_ext/**/*.py"), REPO / "docker-compose.yml"]:
        named |= set(re.findall(r"\bGPUHUB_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert named - {r.name for r in declared()} - NOT_SETTINGS == set()


def test_every_secret_gpuhub_init_writes_is_a_declared_secret():
    from hub_ext.ops.deploy import SECRETS

    assert {n for n in SECRETS if not setting(n).secret} == set()


# -- one definition for the credits CLI and the hub ----------------------------------------


def test_the_credits_cli_finds_the_hubs_state_dir_from_anywhere(tmp_path, monkeypatch):
    """``GPUHUB_STATE_DIR`` unset: the CLI looks where the hub keeps its state (the row's
    default), not in ``./var`` of wherever it runs."""
    from hub_ext.credits import cli
    from hub_ext.credits.hubconfig import ADMIN_TOKEN_FILE

    hub_state = tmp_path / "hub-state"
    hub_state.mkdir()
    (hub_state / ADMIN_TOKEN_FILE).write_text("admin-token\n")
    (tmp_path / "elsewhere" / "var").mkdir(parents=True)
    row = setting("GPUHUB_STATE_DIR")
    monkeypatch.setattr(
        settings_rows,
        "ROWS",
        tuple(dataclasses.replace(r, default=hub_state) if r is row else r for r in declared()),
    )
    monkeypatch.delenv("GPUHUB_STATE_DIR", raising=False)
    monkeypatch.delenv("GPUHUB_CREDITS_PORT", raising=False)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert from_env({}).state_dir == hub_state
    url, token = cli._managed_service(Namespace(command="grant", token=None))
    assert (url, token) == ("http://127.0.0.1:8123/services/credits/", "admin-token")
