"""apply_config's credits part on a fresh Config: what a site's environment turns into."""

from __future__ import annotations

import os
import stat

import pytest
from traitlets.config import Config

from hub_ext.common.notices import home_notices
from hub_ext.config import Settings, apply_config
from hub_ext.credits.hook import CreditsHook
from hub_ext.credits.hubconfig import ADMIN_TOKEN_FILE, HOOK, HUB_TOKEN_FILE
from hub_ext.jobs.hubconfig import HOOK as JOBS_HOOK
from hub_ext.kernels.hubconfig import HOOK as KERNELS_HOOK
from tests.test_config import spawner_reads

REF_SERVICE = ["-m", "hub_ext.credits.service"]


def configure(tmp_path, monkeypatch, **env) -> Config:
    for key in list(os.environ):
        if key.startswith("GPUHUB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GPUHUB_STATE_DIR", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    c = Config()
    apply_config(c, Settings.from_env())
    return c


def first_after_jobs(hooks: list[str]) -> str:
    """The first of ``hooks`` after the kernels' and jobs' hooks, which refuse forged starts
    and must come first."""
    assert sorted(hooks[:2]) == sorted([JOBS_HOOK, KERNELS_HOOK]), hooks
    return hooks[2]


def credits_services(c: Config) -> list[dict]:
    return [s for s in c.JupyterHub.get("services", []) if s["name"] == "credits"]


def test_default_runs_the_reference_service_as_a_managed_service(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch)
    [service] = [s for s in c.JupyterHub.services if s["name"] == "credits"]
    assert service["url"] == "http://127.0.0.1:8123"
    command = service["command"][service["command"].index("--") + 1 :]  # service_guard's
    assert command[1:3] == REF_SERVICE
    assert f"sqlite:///{tmp_path / 'credits.sqlite'}" in service["command"]
    hub_token = (tmp_path / HUB_TOKEN_FILE).read_text().strip()
    admin_token = (tmp_path / ADMIN_TOKEN_FILE).read_text().strip()
    assert len(hub_token) == 64 and hub_token != admin_token
    assert service["environment"] == {
        "GPUHUB_CREDITS_HUB_TOKEN": hub_token,
        "GPUHUB_CREDITS_ADMIN_TOKEN": admin_token,
    }
    assert not any(hub_token in part or admin_token in part for part in service["command"])
    for name in (HUB_TOKEN_FILE, ADMIN_TOKEN_FILE):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert c.CreditsClient.url == "http://127.0.0.1:8123/services/credits/"
    assert c.CreditsClient.token == hub_token
    # first after the jobs hook (which refuses forged job starts), before the culler's
    assert first_after_jobs(spawner_reads(c).before_container_hooks) == HOOK
    assert c.CreditsHook.interval == 900
    assert c.CreditsHook.fail_open is False
    assert c.JupyterHub.template_vars["gpuhub_notices"] is home_notices


def test_tokens_are_made_once_and_kept(tmp_path, monkeypatch):
    first = configure(tmp_path, monkeypatch)
    (tmp_path / HUB_TOKEN_FILE).chmod(0o644)
    second = configure(tmp_path, monkeypatch, GPUHUB_CREDITS_PORT="9001")
    assert second.CreditsClient.token == first.CreditsClient.token
    assert stat.S_IMODE((tmp_path / HUB_TOKEN_FILE).stat().st_mode) == 0o600
    assert second.CreditsClient.url == "http://127.0.0.1:9001/services/credits/"


def test_organisation_api_replaces_the_managed_service(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_CREDITS_URL="https://credits.example.org",
        GPUHUB_CREDITS_TOKEN="org-token",
        GPUHUB_CREDITS_FAIL_OPEN="1",
        GPUHUB_CREDITS_INTERVAL="60",
    )
    assert not credits_services(c)
    assert not (tmp_path / HUB_TOKEN_FILE).exists()
    assert (c.CreditsClient.url, c.CreditsClient.token) == (
        "https://credits.example.org",
        "org-token",
    )
    assert first_after_jobs(spawner_reads(c).before_container_hooks) == HOOK
    assert (c.CreditsHook.fail_open, c.CreditsHook.interval) == (True, 60)


def test_off_means_no_hook_and_no_service(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_CREDITS="off")
    assert HOOK not in spawner_reads(c).before_container_hooks
    assert not credits_services(c)
    assert "CreditsClient" not in c


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"GPUHUB_CREDITS_URL": "https://x.org"},
            "GPUHUB_CREDITS_TOKEN is empty",
            id="url-without-token",
        ),
        pytest.param(
            {"GPUHUB_CREDITS_URL": "x.org", "GPUHUB_CREDITS_TOKEN": "t"},
            "must start with http",
            id="url-without-scheme",
        ),
        pytest.param({"GPUHUB_CREDITS": "maybe"}, "GPUHUB_CREDITS='maybe'", id="bad-switch"),
        pytest.param(
            {"GPUHUB_CREDITS_INTERVAL": "0"}, "GPUHUB_CREDITS_INTERVAL=0", id="empty-interval"
        ),
        pytest.param(
            {"GPUHUB_CREDITS_INTERVAL": "15m"},
            "GPUHUB_CREDITS_INTERVAL='15m'",
            id="interval-not-a-number",
        ),
    ],
)
def test_settings_that_cannot_work_name_the_variable(tmp_path, monkeypatch, env, message):
    with pytest.raises(ValueError, match=message):
        configure(tmp_path, monkeypatch, **env)


def test_hook_traits_validate_at_assignment():
    with pytest.raises(Exception, match="c.CreditsHook.interval must be at least 1 second"):
        CreditsHook(interval=0.5)
    with pytest.raises(Exception, match="c.CreditsHook.grace_period must not be negative"):
        CreditsHook(grace_period=-1)
