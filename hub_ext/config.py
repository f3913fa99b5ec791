"""The hub's configuration as a tested function: ``apply_config(c, Settings.from_env())``.

``jupyterhub_config.py`` is three lines that call this; tests call it on a fresh
``traitlets.config.Config`` and check the result, no hub needed (the pattern of
the-littlest-jupyterhub).  Every environment variable is listed in :class:`Settings` and
in README.md.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .dburl import with_password
from .limits import NAMED_SERVER_LIMIT

REPO = Path(__file__).resolve().parent.parent

#: The profiles a fresh install offers; sites replace them with GPUHUB_PROFILES.  The hub
#: adds a memory and CPU limit from the node to each (:func:`hub_ext.limits.limited_profiles`).
DEFAULT_PROFILES = [
    {
        "display_name": "CPU only",
        "slug": "cpu",
        "description": "JupyterLab and the scientific Python stack, no GPU.",
        "default": True,
        "gpus": 0,
        "credits_per_hour": 0,
        "spawner_override": {"image": "gpuhub/base:latest"},
    },
    {
        "display_name": "PyTorch, 1 GPU",
        "slug": "pytorch",
        "description": "PyTorch on one exclusive GPU.",
        "gpus": 1,
        "credits_per_hour": 1,
        "spawner_override": {"image": "gpuhub/pytorch:latest"},
    },
]


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


@dataclass
class Settings:
    """Everything a site sets, with the environment variable that sets it.

    ===========================  ==============================================  =========
    variable                     meaning                                         default
    ===========================  ==============================================  =========
    GPUHUB_IP / GPUHUB_PORT      where the proxy serves the hub                  127.0.0.1 / 8000
    GPUHUB_HUB_PORT              the hub API's port (on GPUHUB_HUB_IP)           8081
    GPUHUB_PROXY_API_PORT        the proxy's API port on 127.0.0.1               8001
    GPUHUB_STATE_DIR             database, cookie secret, logs                   ./var
    GPUHUB_DB_URL                the hub database (SQLAlchemy URL)               sqlite in state dir
    GPUHUB_GPUS                  ``nvml``, ``simulated:N`` or ``simulated:F``    nvml
    GPUHUB_DOCKER_NETWORK        ``host`` or a Docker bridge network name        gpuhub
    GPUHUB_HOST_NETWORK_ACK      ``1``: host networking off loopback, knowing    off
                                 containers can take the hub's ports
    GPUHUB_PROFILES              JSON file with a profile_list                   built-in
    GPUHUB_IMAGE                 image of profiles that name none                gpuhub/base
    GPUHUB_WORKSPACE             named volume or host path, ``{username}``        see below
    GPUHUB_WORKSPACE_ROOT        host folder that host-path workspaces lie under  none
    GPUHUB_DATASETS              JSON file: {name: {path, groups}}               none
    GPUHUB_UID_MAP               JSON file: {user: {uid, gid}}                   none
    GPUHUB_MAX_GPUS_PER_USER     GPUs one member may hold (0: no limit)          0
    GPUHUB_NAMED_SERVER_LIMIT    named servers per member (0: no limit)          1
    GPUHUB_ACTIVE_SERVER_LIMIT   servers running at once (0: no limit)           1 per GiB
    GPUHUB_CONCURRENT_SPAWN_LIMIT  spawns in progress at once (0: no limit)      20
    GPUHUB_CONTAINER_PREFIX      container names: ``<prefix>-<user>``            jupyter
    GPUHUB_HUB_ID                label that marks this hub's containers          gpuhub
    GPUHUB_DEMO_LOGIN            ``1``: the demo's OIDC provider (loopback only)  off
    GPUHUB_PROXY_COMMAND         configurable-http-proxy executable              node_modules
    GPUHUB_CREDITS               ``off``: no credits at all                      on
    GPUHUB_CREDITS_URL           the organisation's Credits API                  managed service
    GPUHUB_CREDITS_TOKEN         its API token (with GPUHUB_CREDITS_URL)         -
    GPUHUB_CREDITS_PORT          port of the managed reference service           8123
    GPUHUB_CREDITS_FAIL_OPEN     ``1``: start servers when the API is down       off
    GPUHUB_CREDITS_INTERVAL      seconds of one metering interval                900
    GPUHUB_CREDITS_ADMIN_TOKEN   admin token for GPUHUB_CREDITS_URL (grants)     -
    GPUHUB_OIDC_ISSUER           the OIDC provider's issuer URL (required)       -
    GPUHUB_OIDC_CLIENT_ID        client id registered with the provider          -
    GPUHUB_OIDC_CLIENT_SECRET    its client secret                               -
    GPUHUB_OIDC_AUTHORIZE_URL    explicit endpoints; unset: from the issuer's    discovered
    GPUHUB_OIDC_TOKEN_URL          ``.well-known/openid-configuration``
    GPUHUB_OIDC_USERINFO_URL
    GPUHUB_OIDC_JWKS_URL
    GPUHUB_OIDC_CALLBACK_URL     ``https://<host>/hub/oauth_callback``           guessed
    GPUHUB_OIDC_SCOPES           scopes to request (openid profile email)        those three
    GPUHUB_OIDC_USERNAME_CLAIM   claim that is the JupyterHub username           preferred_username
    GPUHUB_OIDC_GROUPS_CLAIM     claim that lists the member's groups            groups
    GPUHUB_OIDC_UID_CLAIM        claims with the member's own uid / gid, so      off
    GPUHUB_OIDC_GID_CLAIM          servers run as them (e.g. uidNumber)
    GPUHUB_ALLOWED_GROUPS        groups whose members may log in (comma list)    none
    GPUHUB_ADMIN_GROUPS          groups whose members are hub admins             none
    GPUHUB_ADMIN_CONTACT         whom refused people should ask                  -
    GPUHUB_INITIAL_CREDITS       credits granted once at a member's first login  none
    GPUHUB_SSL_CERT / _KEY       PEM certificate and key: the proxy serves HTTPS  none
    GPUHUB_ALLOW_HTTP            ``1``: plain HTTP off loopback (a TLS proxy      off
                                 in front of the hub)
    GPUHUB_SECRET_FILES          files the hub refuses to start with when         none
                                 others may read them (comma list)
    GPUHUB_HUB_IP                where the hub API listens (for the servers)      127.0.0.1
    GPUHUB_HUB_CONNECT_IP        how the servers reach the hub API                GPUHUB_HUB_IP
    GPUHUB_DB_PASSWORD           password of the hub database's role             none
    GPUHUB_CREDITS_DB_URL        the reference service's ledger (``upgrade``)    state dir
    GPUHUB_CREDITS_DB_PASSWORD   password of the ledger database's role          none
    GPUHUB_CULL_IDLE_TIMEOUT     seconds without activity before a server is     3600
                                 culled (jupyterhub-idle-culler); 0: never
    GPUHUB_GPU_IDLE_TIMEOUT      seconds a server's GPUs may idle at 0%; 0: never 1800
    GPUHUB_CULL_MAX_AGE          seconds a server may run at most; 0: no limit    0
    GPUHUB_CULL_WARNING          seconds before the maximum age to warn members  900
    GPUHUB_RESERVATION_WARNING   seconds before a reservation to warn members    900
    GPUHUB_LINE_MAX_WAIT         seconds a place in line is kept at most         3600
    GPUHUB_LINE_FAIR_SHARE_DAYS  fewer GPU-hours in so many days go ahead; 0 off 0
    GPUHUB_LINE_BACKFILL_AGE     seconds a big request lets smaller ones pass;   900
                                 0: strict order
    GPUHUB_BACKEND               ``docker`` (this machine) or ``slurm``           docker
    GPUHUB_SLURM_CONF            the cluster's slurm.conf (SLURM_CONF)            Slurm's own
    GPUHUB_SLURM_PARTITION       partition of profiles that name none            Slurm's default
    GPUHUB_SLURM_ACCOUNT         Slurm account the jobs are charged to           none
    GPUHUB_SLURM_QOS             QoS of the jobs                                 none
    GPUHUB_SLURM_TIME            time limit of profiles that name none           partition's
    GPUHUB_SLURM_IMAGE_DIR       shared folder with the unpacked images           see README
    GPUHUB_SLURM_WORKSPACE       workspace on shared storage, ``{username}``      see README
    GPUHUB_SLURM_GPU_DEVICE      a node's GPU device file, bash, index ``$i``    /dev/nvidia$i
    GPUHUB_SLURM_SUBMIT_HOST     run the Slurm commands there over ssh,          the hub's host
                                 ``login1`` or ``gpuhub@login1``
    GPUHUB_SLURM_SSH_OPTIONS     ssh options added for the submit host           none
                                 (``-i KEY -p PORT -o UserKnownHostsFile=F``)
    GPUHUB_SLURM_ACCOUNTING      ``gpuhub usage`` reads Slurm's accounting        auto
                                 (sacct): ``auto`` where the site has it,
                                 ``on`` (its absence is an error), ``off``
    ===========================  ==============================================  =========
    """

    ip: str = "127.0.0.1"
    port: int = 8000
    state_dir: Path = field(default_factory=lambda: REPO / "var")
    db_url: str = ""
    gpus: str = "nvml"
    docker_network: str = "gpuhub"
    host_network_ack: bool = False
    profiles_file: str = ""
    image: str = "gpuhub/base:latest"
    hub_port: int = 8081
    proxy_api_port: int = 8001
    workspace: str = "jupyterhub-user-{username}"
    workspace_root: str = ""
    datasets_file: str = ""
    uid_map_file: str = ""
    max_gpus_per_user: int = 0
    named_server_limit: int = NAMED_SERVER_LIMIT  # besides the default server
    active_server_limit: int | None = None  # None: derived from the node (hub_ext.limits)
    concurrent_spawn_limit: int = 20
    container_prefix: str = "jupyter"
    hub_id: str = "gpuhub"
    demo_login: bool = False
    proxy_command: str = ""
    credits: bool = True
    credits_url: str = ""
    credits_token: str = ""
    credits_port: int = 8123
    credits_fail_open: bool = False
    credits_interval: int = 900
    credits_admin_token: str = ""
    oidc_issuer: str = ""
    oidc_client_id: str = ""
    oidc_client_secret: str = ""
    oidc_authorize_url: str = ""
    oidc_token_url: str = ""
    oidc_userinfo_url: str = ""
    oidc_jwks_url: str = ""
    oidc_callback_url: str = ""
    oidc_scopes: str = ""
    oidc_username_claim: str = ""
    oidc_groups_claim: str = ""
    oidc_uid_claim: str = ""
    oidc_gid_claim: str = ""
    allowed_groups: str = ""
    admin_groups: str = ""
    admin_contact: str = ""
    initial_credits: str = ""
    ssl_cert: str = ""
    ssl_key: str = ""
    allow_http: bool = False
    secret_files: str = ""
    hub_ip: str = "127.0.0.1"
    hub_connect_ip: str = ""
    db_password: str = ""
    credits_db_url: str = ""
    credits_db_password: str = ""
    cull_idle_timeout: int = 3600
    gpu_idle_timeout: int = 1800
    cull_max_age: int = 0
    cull_warning: int = 900
    reservation_warning: int = 900
    line_max_wait: int = 3600
    line_fair_share_days: int = 0
    line_backfill_age: int = 900
    backend: str = "docker"
    slurm_conf: str = ""
    slurm_partition: str = ""
    slurm_account: str = ""
    slurm_qos: str = ""
    slurm_time: str = ""
    slurm_image_dir: str = ""
    slurm_workspace: str = ""
    slurm_gpu_device: str = ""
    slurm_submit_host: str = ""
    slurm_ssh_options: str = ""
    slurm_accounting: str = "auto"

    @classmethod
    def from_env(cls) -> Settings:
        """Read the GPUHUB_* variables; raises ValueError naming a malformed one."""
        s = cls()
        s.ip = _env("GPUHUB_IP", s.ip)
        s.port = _int("GPUHUB_PORT", s.port)
        s.state_dir = Path(_env("GPUHUB_STATE_DIR", str(s.state_dir))).resolve()
        s.db_url = _env("GPUHUB_DB_URL")
        s.gpus = _env("GPUHUB_GPUS", s.gpus)
        s.docker_network = _env("GPUHUB_DOCKER_NETWORK", s.docker_network)
        s.host_network_ack = _flag("GPUHUB_HOST_NETWORK_ACK", False)
        s.profiles_file = _env("GPUHUB_PROFILES")
        s.image = _env("GPUHUB_IMAGE", s.image)
        s.hub_port = _int("GPUHUB_HUB_PORT", s.hub_port)
        s.proxy_api_port = _int("GPUHUB_PROXY_API_PORT", s.proxy_api_port)
        s.workspace = _env("GPUHUB_WORKSPACE", s.workspace)
        s.workspace_root = _env("GPUHUB_WORKSPACE_ROOT")
        s.datasets_file = _env("GPUHUB_DATASETS")
        s.uid_map_file = _env("GPUHUB_UID_MAP")
        s.max_gpus_per_user = _int("GPUHUB_MAX_GPUS_PER_USER", 0)
        s.named_server_limit = _int("GPUHUB_NAMED_SERVER_LIMIT", s.named_server_limit)
        if _env("GPUHUB_ACTIVE_SERVER_LIMIT"):
            s.active_server_limit = _int("GPUHUB_ACTIVE_SERVER_LIMIT", 0)
        s.concurrent_spawn_limit = _int("GPUHUB_CONCURRENT_SPAWN_LIMIT",
                                        s.concurrent_spawn_limit)
        s.container_prefix = _env("GPUHUB_CONTAINER_PREFIX", s.container_prefix)
        s.hub_id = _env("GPUHUB_HUB_ID", s.hub_id)
        s.demo_login = _env("GPUHUB_DEMO_LOGIN") == "1"
        s.proxy_command = _env("GPUHUB_PROXY_COMMAND")
        credits = _env("GPUHUB_CREDITS", "on").lower()
        if credits not in ("on", "off"):
            raise ValueError(f"GPUHUB_CREDITS={credits!r}: use 'on' or 'off'")
        s.credits = credits == "on"
        s.credits_url = _env("GPUHUB_CREDITS_URL")
        s.credits_token = _env("GPUHUB_CREDITS_TOKEN")
        s.credits_port = _int("GPUHUB_CREDITS_PORT", s.credits_port)
        s.credits_fail_open = _env("GPUHUB_CREDITS_FAIL_OPEN") == "1"
        s.credits_interval = _int("GPUHUB_CREDITS_INTERVAL", s.credits_interval)
        s.credits_admin_token = _env("GPUHUB_CREDITS_ADMIN_TOKEN")
        s.oidc_issuer = _env("GPUHUB_OIDC_ISSUER")
        s.oidc_client_id = _env("GPUHUB_OIDC_CLIENT_ID")
        s.oidc_client_secret = _env("GPUHUB_OIDC_CLIENT_SECRET")
        s.oidc_authorize_url = _env("GPUHUB_OIDC_AUTHORIZE_URL")
        s.oidc_token_url = _env("GPUHUB_OIDC_TOKEN_URL")
        s.oidc_userinfo_url = _env("GPUHUB_OIDC_USERINFO_URL")
        s.oidc_jwks_url = _env("GPUHUB_OIDC_JWKS_URL")
        s.oidc_callback_url = _env("GPUHUB_OIDC_CALLBACK_URL")
        s.oidc_scopes = _env("GPUHUB_OIDC_SCOPES")
        s.oidc_username_claim = _env("GPUHUB_OIDC_USERNAME_CLAIM")
        s.oidc_groups_claim = _env("GPUHUB_OIDC_GROUPS_CLAIM")
        s.oidc_uid_claim = _env("GPUHUB_OIDC_UID_CLAIM")
        s.oidc_gid_claim = _env("GPUHUB_OIDC_GID_CLAIM")
        s.allowed_groups = _env("GPUHUB_ALLOWED_GROUPS")
        s.admin_groups = _env("GPUHUB_ADMIN_GROUPS")
        s.admin_contact = _env("GPUHUB_ADMIN_CONTACT")
        s.initial_credits = _env("GPUHUB_INITIAL_CREDITS")
        s.ssl_cert = _env("GPUHUB_SSL_CERT")
        s.ssl_key = _env("GPUHUB_SSL_KEY")
        s.allow_http = _flag("GPUHUB_ALLOW_HTTP", False)
        s.secret_files = _env("GPUHUB_SECRET_FILES")
        s.hub_ip = _env("GPUHUB_HUB_IP", s.hub_ip)
        s.hub_connect_ip = _env("GPUHUB_HUB_CONNECT_IP")
        s.db_password = _env("GPUHUB_DB_PASSWORD")
        s.credits_db_url = _env("GPUHUB_CREDITS_DB_URL")
        s.credits_db_password = _env("GPUHUB_CREDITS_DB_PASSWORD")
        s.cull_idle_timeout = _int("GPUHUB_CULL_IDLE_TIMEOUT", s.cull_idle_timeout)
        s.gpu_idle_timeout = _int("GPUHUB_GPU_IDLE_TIMEOUT", s.gpu_idle_timeout)
        s.cull_max_age = _int("GPUHUB_CULL_MAX_AGE", s.cull_max_age)
        s.cull_warning = _int("GPUHUB_CULL_WARNING", s.cull_warning)
        s.reservation_warning = _int("GPUHUB_RESERVATION_WARNING", s.reservation_warning)
        s.line_max_wait = _int("GPUHUB_LINE_MAX_WAIT", s.line_max_wait)
        s.line_fair_share_days = _int("GPUHUB_LINE_FAIR_SHARE_DAYS", s.line_fair_share_days)
        s.line_backfill_age = _int("GPUHUB_LINE_BACKFILL_AGE", s.line_backfill_age)
        s.backend = _env("GPUHUB_BACKEND", s.backend).lower()
        if s.backend not in ("docker", "slurm"):
            raise ValueError(f"GPUHUB_BACKEND={s.backend!r}: use 'docker' or 'slurm'")
        for name in ("conf", "partition", "account", "qos", "time", "image_dir",
                     "workspace", "gpu_device", "submit_host", "ssh_options"):
            setattr(s, f"slurm_{name}", _env(f"GPUHUB_SLURM_{name.upper()}"))
        s.slurm_accounting = (_env("GPUHUB_SLURM_ACCOUNTING") or s.slurm_accounting).lower()
        if s.slurm_accounting not in ("auto", "on", "off"):
            raise ValueError(f"GPUHUB_SLURM_ACCOUNTING={s.slurm_accounting!r}: use 'auto', "
                             "'on' or 'off'")
        return s


def _int(name: str, default: int) -> int:
    raw = _env(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None


def _flag(name: str, default: bool) -> bool:
    """``1`` or ``0`` (empty: ``default``); raises ValueError naming the variable otherwise."""
    raw = _env(name)
    if not raw:
        return default
    if raw not in ("0", "1"):
        raise ValueError(f"{name}={raw!r}: use 1 (on) or 0 (off)")
    return raw == "1"


def hub_db_url(settings: Settings) -> str:
    """The hub database's SQLAlchemy URL, with ``GPUHUB_DB_PASSWORD`` filled in.

    The password is kept out of ``GPUHUB_DB_URL`` so that the URL can be shown; JupyterHub
    redacts it whenever it logs the URL.  Without ``GPUHUB_DB_URL``: SQLite in the state dir.
    """
    url = settings.db_url or f"sqlite:///{settings.state_dir / 'jupyterhub.sqlite'}"
    return with_password(url, settings.db_password, "GPUHUB_DB_PASSWORD")


def load_profiles(path: str) -> list[dict]:
    """The profile list from a JSON file, or the built-in defaults when ``path`` is empty."""
    if not path:
        return DEFAULT_PROFILES
    import json

    with open(path) as f:
        data = json.load(f)
    return data["profile_list"] if isinstance(data, dict) else data


def proxy_command(settings: Settings) -> list[str]:
    """configurable-http-proxy: the setting, the repo's node_modules, or PATH."""
    if settings.proxy_command:
        return [settings.proxy_command]
    local = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    if local.exists():
        return [str(local)]
    return [shutil.which("configurable-http-proxy") or "configurable-http-proxy"]


def apply_config(c, settings: Settings) -> None:
    """Fill the JupyterHub config object ``c`` from ``settings``.

    The state directory is made mode 0700 and a SQLite hub database mode 0600
    (:mod:`hub_ext.private_files`); managed services are guarded to die with the hub
    (:mod:`hub_ext.service_guard`), and the hub that loads this configuration stops its
    periodic passes before its services when it shuts down (:mod:`hub_ext.periodic`).
    Raises ValueError for a setting that cannot work
    (e.g. the demo login on a non-loopback address, plain HTTP off loopback without
    ``GPUHUB_ALLOW_HTTP=1``, a secret file that others may read: :mod:`hub_ext.serving`).
    """
    from .private_files import private_dir, private_sqlite

    state = private_dir(settings.state_dir)

    c.JupyterHub.db_url = hub_db_url(settings)
    private_sqlite(c.JupyterHub.db_url)
    c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")
    c.ConfigurableHTTPProxy.command = proxy_command(settings)
    c.JupyterHub.allow_named_servers = True
    # servers (and the GPUs they hold) outlive a hub restart or upgrade; the hub finds
    # them again from its database, spawner state and container labels
    c.JupyterHub.cleanup_servers = False
    from .logs import logging_config

    # JupyterHub logs some request bodies whole: no line longer than a few thousand
    # characters, whatever a request carried
    c.JupyterHub.logging_config = logging_config(
        c.JupyterHub.logging_config if "logging_config" in c.JupyterHub else None)
    from .templates import template_dir

    c.JupyterHub.template_paths = [str(template_dir())]
    from .handlers import handlers

    c.JupyterHub.extra_handlers = handlers
    from .notices import home_notices

    template_vars = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    template_vars["gpuhub_notices"] = home_notices
    from .line.handlers import home_places

    template_vars["gpuhub_line"] = home_places
    c.JupyterHub.template_vars = template_vars

    # What both backends' spawners read, set once on the core's sections: every spawner
    # is a SpawnerCore, and traitlets gives an instance the sections of each Configurable
    # class in its MRO (the nearest class winning), as TLJH sets c.Spawner.*
    from .limits import Node, apply_limits_config, limited_profiles, node_gpu_count

    node = Node.probe(node_gpu_count(settings.gpus))
    profiles = load_profiles(settings.profiles_file)
    if not settings.profiles_file:
        profiles = limited_profiles(profiles, node)
    apply_limits_config(c, settings, node)
    c.SpawnerCore.profile_list = profiles
    c.SpawnerCore.image = settings.image
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 60
    c.Spawner.default_url = "/lab"
    if settings.datasets_file:
        import json

        with open(settings.datasets_file) as f:
            c.SpawnerCore.datasets = json.load(f)

    from .credits.hubconfig import apply_credits_config

    apply_credits_config(c, settings)

    from .culling_config import apply_culling_config

    apply_culling_config(c, settings, profiles)

    from .line.hubconfig import apply_line_config

    apply_line_config(c, settings)

    from .admin import apply_admin_config

    apply_admin_config(c, settings)
    from .reservations.hubconfig import apply_reservations_config

    apply_reservations_config(c, settings)

    from .auth_config import apply_auth_config

    apply_auth_config(c, settings)

    from .serving import apply_serving_config

    apply_serving_config(c, settings)

    from .service_guard import guard_services

    guard_services(c, state)
    from jupyterhub.app import JupyterHub

    if JupyterHub.initialized():  # the hub loading this configuration, not a config check
        from .periodic import stop_passes_first

        stop_passes_first(JupyterHub.instance())

    # the backend's own settings: its spawner class, and the traits only it has
    from .backends import backend

    backend(settings.backend).apply_config(c, settings)
