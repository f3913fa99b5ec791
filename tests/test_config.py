"""apply_config on a fresh Config: what a site's environment turns into."""

from __future__ import annotations

import json
import sys

import pytest
from traitlets.config import Config

from hub_ext.common.notices import home_notices
from hub_ext.config import Settings, apply_config
from hub_ext.credits.hubconfig import HOOK as CREDITS_HOOK
from hub_ext.culling.arbiter import CONFIG_TEXT, ENV
from hub_ext.culling.culler import log_request
from hub_ext.culling.hubconfig import HOOK, cull_every
from hub_ext.jobs.handlers import JOBS_SCOPE
from hub_ext.jobs.hubconfig import HOOK as JOBS_HOOK
from hub_ext.kernels.handlers import KERNELS_SCOPE, display_name
from hub_ext.kernels.hubconfig import HOOK as KERNELS_HOOK
from hub_ext.ops.board import GPUS_SCOPE, LINE_ADMIN_SCOPE
from hub_ext.ops.my_gpus import MINE_SCOPE
from hub_ext.reservations.handlers import RESERVATIONS_SCOPE
from hub_ext.spawn.profiles import init_profiles, kernels_allowed


def settings_from(tmp_path, monkeypatch, **env) -> Settings:
    """``Settings.from_env()`` with only these GPUHUB_* variables, state in ``tmp_path``."""
    for key in list(__import__("os").environ):
        if key.startswith("GPUHUB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GPUHUB_STATE_DIR", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings.from_env()


def configure(tmp_path, monkeypatch, **env):
    c = Config()
    apply_config(c, settings_from(tmp_path, monkeypatch, **env))
    return c


def spawner_class(backend: str):
    if backend == "docker":
        from hub_ext.docker.spawner import GPUDockerSpawner

        return GPUDockerSpawner
    from hub_ext.slurm.spawner import GPUSlurmSpawner

    return GPUSlurmSpawner


def spawner_reads(c: Config, backend: str = "docker") -> Config:
    """What the backend's spawner reads of ``c``: the sections of every configurable class
    in its MRO, merged as traitlets merges them (``Configurable._find_my_config``: the
    nearest class wins)."""
    merged = Config()
    for name in spawner_class(backend).section_names():
        if c._has_section(name):
            merged.merge(c[name])
    return merged


def test_defaults_are_production_shaped(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch)
    assert "gpuhub_short_lines" in c.JupyterHub.logging_config["handlers"]["console"]["filters"]
    assert c.JupyterHub.spawner_class == "hub_ext.docker.spawner.GPUDockerSpawner"
    assert c.GPUPool.inventory_class == "nvml"
    assert c.GPUDockerSpawner.network_name == "gpuhub"  # a bridge network
    assert "host_network" not in c.GPUDockerSpawner
    assert c.JupyterHub.db_url == f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    assert c.JupyterHub.authenticator_class == "hub_ext.login.authenticator.CreditAuthenticator"
    # servers and their GPUs outlive a hub restart (JupyterHub's default stops them all)
    assert c.JupyterHub.cleanup_servers is False


def test_the_shipped_pytorch_profile_offers_gpu_kernels_and_the_cpu_one_not(tmp_path, monkeypatch):
    """A fresh install lists "Python 3 (PyTorch, 1 GPU, 1.00 credits/h)" beside "Python 3"
    in every server's launcher (docs: howto/gpu-kernels)."""
    c = configure(tmp_path, monkeypatch)
    offered = {p["slug"]: kernels_allowed(p) for p in init_profiles(c.SpawnerCore.profile_list)}
    assert offered == {"cpu": False, "pytorch": True}
    (pytorch,) = [p for p in c.SpawnerCore.profile_list if p["slug"] == "pytorch"]
    listed = display_name(pytorch["display_name"], "1 GPU", pytorch["credits_per_hour"])
    assert listed == "Python 3 (PyTorch, 1 GPU, 1.00 credits/h)"


def test_host_network_sets_what_docker_needs(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_DOCKER_NETWORK="host")
    s = c.GPUDockerSpawner
    assert (s.host_network, s.network_name, s.use_internal_ip, s.ip) == (
        True,
        "host",
        True,
        "127.0.0.1",
    )


def test_simulated_gpus_are_explicit(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_GPUS="simulated:2")
    assert c.GPUPool.inventory_class == "simulated"
    assert c.GPUPool.simulated_devices == "2"


def test_unknown_gpu_source_is_an_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="GPUHUB_GPUS='fake'"):
        configure(tmp_path, monkeypatch, GPUHUB_GPUS="fake")


def test_demo_login_only_on_loopback(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_DEMO_LOGIN="1")
    assert c.JupyterHub.authenticator_class == "hub_ext.login.authenticator.CreditAuthenticator"
    assert "not for production" in c.CreditAuthenticator.login_service
    with pytest.raises(ValueError, match="only runs on loopback"):
        configure(tmp_path, monkeypatch, GPUHUB_DEMO_LOGIN="1", GPUHUB_IP="0.0.0.0")


OIDC = {
    "GPUHUB_OIDC_ISSUER": "https://login.example.org/realms/club",
    "GPUHUB_OIDC_CLIENT_ID": "gpuhub",
    "GPUHUB_OIDC_CLIENT_SECRET": "s3cret",
}


def test_oidc_settings_reach_the_authenticator(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        **OIDC,
        GPUHUB_ALLOWED_GROUPS="gpu-members, ml101",
        GPUHUB_ADMIN_GROUPS="hub-admins",
        GPUHUB_OIDC_GROUPS_CLAIM="roles",
        GPUHUB_OIDC_USERNAME_CLAIM="email",
        GPUHUB_OIDC_SCOPES="openid profile roles",
        GPUHUB_OIDC_TOKEN_URL="https://login.example.org/token",
        GPUHUB_ADMIN_CONTACT="hub-admins@example.org",
    )
    a = c.CreditAuthenticator
    assert (a.issuer, a.client_id, a.client_secret) == (
        "https://login.example.org/realms/club",
        "gpuhub",
        "s3cret",
    )
    assert a.allowed_groups == {"gpu-members", "ml101"}
    assert a.admin_groups == {"hub-admins"}
    assert a.auth_state_groups_key == "oauth_user.roles"
    assert a.username_claim == "email"
    assert a.scope == ["openid", "profile", "roles"]
    assert a.token_url == "https://login.example.org/token"
    assert "authorize_url" not in a  # discovered from the issuer
    assert a.admin_contact == "hub-admins@example.org"
    assert a.credits_enabled is True

    from hub_ext.login.authenticator import CreditAuthenticator

    authenticator = CreditAuthenticator(config=c)
    assert authenticator.manage_groups and authenticator.enable_auth_state
    assert authenticator.refresh_pre_spawn  # groups and credits are fresh at each spawn
    assert authenticator.token_url == "https://login.example.org/token"
    assert authenticator.authorize_url == ""  # until the discovery document is read


def test_authenticator_refuses_to_start_without_issuer_or_client(tmp_path, monkeypatch):
    from hub_ext.login.authenticator import CreditAuthenticator

    c = configure(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="GPUHUB_OIDC_ISSUER"):
        CreditAuthenticator(config=c)
    c = configure(tmp_path, monkeypatch, GPUHUB_OIDC_ISSUER=OIDC["GPUHUB_OIDC_ISSUER"])
    with pytest.raises(ValueError, match="GPUHUB_OIDC_CLIENT_ID"):
        CreditAuthenticator(config=c)


def test_initial_grant_uses_the_managed_services_admin_token(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, **OIDC, GPUHUB_INITIAL_CREDITS="10")
    a = c.CreditAuthenticator
    assert a.initial_credits == "10"
    assert a.credits_admin_token == (tmp_path / "credits-admin-token").read_text().strip()
    assert "gpuhub_member" in c.JupyterHub.template_vars


def test_initial_grant_with_an_external_api_needs_its_admin_token(tmp_path, monkeypatch):
    external = {
        "GPUHUB_CREDITS_URL": "https://credits.example.org",
        "GPUHUB_CREDITS_TOKEN": "hub-token",
        "GPUHUB_INITIAL_CREDITS": "10",
    }
    with pytest.raises(ValueError, match="GPUHUB_CREDITS_ADMIN_TOKEN"):
        configure(tmp_path, monkeypatch, **OIDC, **external)
    c = configure(
        tmp_path, monkeypatch, **OIDC, **external, GPUHUB_CREDITS_ADMIN_TOKEN="admin-token"
    )
    assert c.CreditAuthenticator.credits_admin_token == "admin-token"


@pytest.mark.parametrize("amount", ["ten", "1.234", "-5", "1e3"])
def test_malformed_initial_credits_name_the_trait(tmp_path, monkeypatch, amount):
    from hub_ext.login.authenticator import CreditAuthenticator

    c = configure(tmp_path, monkeypatch, **OIDC, GPUHUB_INITIAL_CREDITS=amount)
    with pytest.raises(ValueError, match="initial_credits must be an amount"):
        CreditAuthenticator(config=c)


def test_credits_off_reads_no_accounts_and_shows_no_balance(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, **OIDC, GPUHUB_CREDITS="off", GPUHUB_INITIAL_CREDITS="10")
    assert c.CreditAuthenticator.credits_enabled is False
    assert "initial_credits" not in c.CreditAuthenticator
    assert "gpuhub_member" not in (
        c.JupyterHub.template_vars if "template_vars" in c.JupyterHub else {}
    )


def test_malformed_number_names_the_variable(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="GPUHUB_PORT='eighty'"):
        configure(tmp_path, monkeypatch, GPUHUB_PORT="eighty")


# -- culling and the GPU board -----------------------------------------------------------------


def service(c: Config, name: str) -> dict | None:
    return next((s for s in c.JupyterHub.services if s["name"] == name), None)


def role(c: Config, name: str) -> dict:
    [found] = [r for r in c.JupyterHub.load_roles if r["name"] == name]
    return found


def test_idle_culler_runs_as_a_managed_service_with_only_its_scopes(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch)
    culler = service(c, "idle-culler")
    command = culler["command"]
    assert command[command.index("--") + 1 :] == [
        sys.executable,
        "-m",
        "jupyterhub_idle_culler",
        "--timeout=3600",
        "--cull-every=300",
        f"--config={tmp_path / 'idle_culler_config.py'}",
    ]
    assert (tmp_path / "idle_culler_config.py").read_text() == CONFIG_TEXT
    assert [p["slug"] for p in json.loads(culler["environment"][ENV])] == ["cpu", "pytorch"]
    assert "api_token" not in culler and "admin" not in culler  # JupyterHub makes its token
    assert role(c, "idle-culler") == {
        "name": "idle-culler",
        "description": "jupyterhub-idle-culler: list servers and their activity, stop them",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }


def test_culler_hook_follows_credits_and_sees_every_request(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch)
    # the kernels' and jobs' hooks first: a forged kernel or job start is refused before
    # anything is asked
    assert spawner_reads(c).before_container_hooks == [
        KERNELS_HOOK,
        JOBS_HOOK,
        CREDITS_HOOK,
        HOOK,
    ]
    assert c.JupyterHub.tornado_settings["log_function"] is log_request
    assert c.JupyterHub.template_vars["gpuhub_notices"] is home_notices
    assert c.Culler.service_name == "idle-culler"


def test_site_wide_limits_become_the_spawners_defaults(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_CULL_IDLE_TIMEOUT="1800",
        GPUHUB_GPU_IDLE_TIMEOUT="900",
        GPUHUB_CULL_MAX_AGE="28800",
        GPUHUB_CULL_WARNING="600",
    )
    s = spawner_reads(c)
    assert (s.cull_idle_timeout, s.gpu_idle_timeout, s.cull_max_age) == (1800, 900, 28800)
    assert c.Culler.max_age_warning == 600
    assert "--timeout=1800" in service(c, "idle-culler")["command"]


def test_defaults(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch)
    s = spawner_reads(c)
    assert (s.cull_idle_timeout, s.gpu_idle_timeout, s.cull_max_age) == (3600, 1800, 0)
    assert c.Culler.max_age_warning == 900


def test_the_gpu_kernels_time_outs_reach_their_keeper(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch)
    assert (c.Kernels.idle_timeout, c.Kernels.contended_idle_timeout) == (900, 300)
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_KERNEL_IDLE_TIMEOUT="1200",
        GPUHUB_KERNEL_CONTENDED_IDLE_TIMEOUT="0",
    )
    assert (c.Kernels.idle_timeout, c.Kernels.contended_idle_timeout) == (1200, 0)


def test_no_idle_timeout_anywhere_means_no_idle_culler(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_CULL_IDLE_TIMEOUT="0")
    assert service(c, "idle-culler") is None
    assert HOOK in spawner_reads(c).before_container_hooks  # GPUs and max age still


def test_a_profiles_idle_timeout_runs_the_culler_often_enough(tmp_path, monkeypatch):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        json.dumps(
            [
                {"display_name": "CPU", "default": True},
                {"display_name": "GPU", "gpus": 1, "cull_idle_timeout": 120},
            ]
        )
    )
    c = configure(
        tmp_path, monkeypatch, GPUHUB_PROFILES=str(profiles), GPUHUB_CULL_IDLE_TIMEOUT="0"
    )
    assert "--cull-every=60" in service(c, "idle-culler")["command"]
    assert "--timeout=0" in service(c, "idle-culler")["command"]


@pytest.mark.parametrize(
    ("timeout", "limits", "every"),
    [
        pytest.param(3600, set(), 300, id="at-most-five-minutes"),
        pytest.param(300, set(), 150, id="half-the-timeout"),
        pytest.param(3600, {600.0, 0.0}, 300, id="profiles-longer"),
        pytest.param(3600, {120.0}, 60, id="a-stricter-profile"),
        pytest.param(2, set(), 1, id="at-least-a-second"),
    ],
)
def test_cull_every_is_half_the_shortest_timeout(timeout, limits, every):
    assert cull_every(timeout, limits) == every


@pytest.mark.parametrize(
    "variable",
    [
        "GPUHUB_CULL_IDLE_TIMEOUT",
        "GPUHUB_GPU_IDLE_TIMEOUT",
        "GPUHUB_CULL_MAX_AGE",
        "GPUHUB_CULL_WARNING",
    ],
)
def test_negative_limits_name_the_variable(tmp_path, monkeypatch, variable):
    with pytest.raises(ValueError, match=f"{variable}=-1"):
        configure(tmp_path, monkeypatch, **{variable: "-1"})


def test_gpu_board_scope_goes_to_the_admin_groups(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_ADMIN_GROUPS="hub-admins, staff")
    assert GPUS_SCOPE in c.JupyterHub.custom_scopes
    assert role(c, "gpuhub-gpu-admins")["scopes"] == [
        GPUS_SCOPE,
        LINE_ADMIN_SCOPE,
        RESERVATIONS_SCOPE,
        JOBS_SCOPE,
        KERNELS_SCOPE,
    ]
    assert RESERVATIONS_SCOPE in c.JupyterHub.custom_scopes
    assert role(c, "gpuhub-gpu-admins")["groups"] == ["hub-admins", "staff"]
    routes = [route for route, _ in c.JupyterHub.extra_handlers]
    assert {"/gpus", "/api/gpuhub/gpus"} <= set(routes)


def test_the_cli_service_reads_the_gpu_board_manages_reservations_and_nothing_else(
    tmp_path, monkeypatch
):
    c = configure(tmp_path, monkeypatch)
    assert service(c, "gpuhub-cli") == {
        "name": "gpuhub-cli",
        "api_token": (tmp_path / "gpuhub-cli-token").read_text().strip(),
        "display": False,
    }
    assert role(c, "gpuhub-cli") == {
        "name": "gpuhub-cli",
        "description": "gpuhub gpus and gpuhub reservations on the hub's machine: read the "
        "GPU board, manage reservations",
        "scopes": [GPUS_SCOPE, RESERVATIONS_SCOPE, JOBS_SCOPE, KERNELS_SCOPE],
        "services": ["gpuhub-cli"],
    }


def test_on_slurm_runs_are_recorded_and_the_culler_reads_no_local_gpus(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_BACKEND="slurm")
    assert c.JupyterHub.spawner_class == "hub_ext.slurm.spawner.GPUSlurmSpawner"
    assert spawner_reads(c, "slurm").before_container_hooks == [
        KERNELS_HOOK,
        JOBS_HOOK,
        CREDITS_HOOK,
        HOOK,
    ]
    assert c.Culler.gpu_units is None  # no NVML readings on the hub's machine


SHARED = {
    "profile_list",
    "image",
    "datasets",
    "before_container_hooks",
    "gpu_idle_timeout",
    "cull_idle_timeout",
    "cull_max_age",
    "default_url",
    "start_timeout",
    "http_timeout",
}


@pytest.mark.parametrize("backend", ["docker", "slurm"])
def test_shared_settings_are_set_once_for_both_backends(tmp_path, monkeypatch, backend):
    """Profiles, image, datasets, hooks and limits are set on the core's sections, which
    either backend's spawner reads (traitlets' section inheritance), not copied from one
    backend's section to the other's."""
    datasets = tmp_path / "datasets.json"
    datasets.write_text(json.dumps({"imagenet": {"path": "/data/imagenet"}}))
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_BACKEND=backend,
        GPUHUB_IMAGE="site/img:1",
        GPUHUB_DATASETS=str(datasets),
        GPUHUB_GPU_IDLE_TIMEOUT="900",
    )
    reads = spawner_reads(c, backend)
    assert SHARED <= set(reads)
    assert (reads.image, reads.datasets, reads.gpu_idle_timeout, reads.default_url) == (
        "site/img:1",
        {"imagenet": {"path": "/data/imagenet"}},
        900,
        "/lab",
    )
    assert [p["slug"] for p in reads.profile_list] == ["cpu", "pytorch"]
    for section in ("GPUDockerSpawner", "GPUSlurmSpawner"):  # nothing shared set twice
        assert not SHARED & set(c.get(section, {})) - {"start_timeout"}, section
    if backend == "slurm":  # a job may wait: Slurm's own time-out, above the core's
        assert (c.Spawner.start_timeout, reads.start_timeout) == (120, 3600)
        assert "GPUDockerSpawner" not in c and "GPUPool" not in c  # Docker's own: not set


@pytest.mark.parametrize("backend", ["docker", "slurm"])
def test_each_setting_a_spawner_reads_is_one_of_its_traits(tmp_path, monkeypatch, backend):
    """A backend's own setting on the core's section would reach the other backend's
    spawner as an unknown option (traitlets: "Config option not recognized")."""
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_BACKEND=backend,
        GPUHUB_DOCKER_NETWORK="host",
        GPUHUB_SLURM_PARTITION="gpu",
    )
    traits = spawner_class(backend).class_traits(config=True)
    assert set(spawner_reads(c, backend)) - set(traits) == set()


def slurm_spawner(c: Config):
    from types import SimpleNamespace

    from hub_ext.slurm.spawner import GPUSlurmSpawner

    user = SimpleNamespace(
        name="alice",
        url="/user/alice/",
        escaped_name="alice",
        server=None,
        settings={},
        db=None,
        orm_user=None,
        id=1,
    )
    return GPUSlurmSpawner(config=c, user=user)


def test_a_slurm_spawner_reads_the_core_sections_and_its_own(tmp_path, monkeypatch):
    """traitlets' section inheritance on a real spawner: what the hub set once on
    ``c.SpawnerCore`` and ``c.Spawner`` reaches it, with Slurm's own settings."""
    c = configure(
        tmp_path,
        monkeypatch,
        GPUHUB_BACKEND="slurm",
        GPUHUB_IMAGE="site/img:1",
        GPUHUB_CULL_MAX_AGE="7200",
        GPUHUB_SLURM_PARTITION="gpu",
    )
    spawner = slurm_spawner(c)
    assert (
        spawner.image,
        spawner.cull_max_age,
        spawner.default_url,
        spawner.http_timeout,
        spawner.start_timeout,
        spawner.req_partition,
    ) == ("site/img:1", 7200, "/lab", 60, 3600, "gpu")
    assert spawner.before_container_hooks == [KERNELS_HOOK, JOBS_HOOK, CREDITS_HOOK, HOOK]
    assert [p["slug"] for p in spawner.profile_list] == ["cpu", "pytorch"]


def test_a_hook_that_is_no_hook_is_refused_naming_the_setting(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_BACKEND="slurm")
    c.SpawnerCore.before_container_hooks = [CREDITS_HOOK, object()]
    with pytest.raises(
        ValueError,
        match=r"before_container_hooks: <object .*> is not a "
        r"hub_ext\.spawn\.hooks\.Hook",
    ):
        slurm_spawner(c)


def test_members_and_their_servers_hold_the_jobs_scope_for_their_own_jobs_only(
    tmp_path, monkeypatch
):
    c = configure(tmp_path, monkeypatch, GPUHUB_JOBS_PER_USER="2", GPUHUB_JOB_NOTEBOOK_MAX_MIB="5")
    assert JOBS_SCOPE in c.JupyterHub.custom_scopes
    assert role(c, "user")["scopes"] == [
        "self",
        f"{JOBS_SCOPE}!user",
        f"{KERNELS_SCOPE}!user",
        f"{MINE_SCOPE}!user",
    ]
    # JupyterHub's own server role, the member's jobs and GPU kernels (what the Scheduler
    # and the kernel provisioner need), and the GPUs of that one server and its GPU
    # kernels (JupyterLab's status bar)
    assert c.Spawner.server_token_scopes == [
        "users:activity!user",
        "access:servers!server",
        f"{JOBS_SCOPE}!user",
        f"{KERNELS_SCOPE}!user",
        f"{MINE_SCOPE}!server",
    ]
    routes = [route for route, _ in c.JupyterHub.extra_handlers]
    assert {"/api/gpuhub/jobs", "/api/gpuhub/jobs/environments"} <= set(routes)
    assert (c.Jobs.per_user, c.Jobs.notebook_max_mib) == (2, 5)
