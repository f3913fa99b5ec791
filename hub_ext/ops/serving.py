"""How the hub faces the network: ``apply_serving_config(c, settings)``.

- **Public address** (``GPUHUB_IP``, ``GPUHUB_PORT``): where configurable-http-proxy serves
  the hub and the members' servers.  It serves HTTPS from ``GPUHUB_SSL_CERT`` and
  ``GPUHUB_SSL_KEY`` (PEM files; JupyterHub's ``ssl_cert``/``ssl_key``, which it hands to
  the proxy).  Plain HTTP is refused on any address but loopback unless
  ``GPUHUB_ALLOW_HTTP=1`` says that a TLS reverse proxy of the site stands in front of the
  hub: login cookies and OAuth codes must never cross a network in clear text.
- **Hub API** (``GPUHUB_HUB_IP``, ``GPUHUB_HUB_PORT``, ``GPUHUB_HUB_CONNECT_IP``): where the
  members' servers reach the hub.  127.0.0.1 works when they share the hub's network
  (host networking); on a Docker bridge network the hub listens on ``0.0.0.0`` and the
  servers connect to a name they can resolve there (``docker-compose.yml``: ``pod``).
- **Proxy API** (``GPUHUB_PROXY_API_PORT``): always on 127.0.0.1; only the hub uses it.
- **Host networking** (``GPUHUB_DOCKER_NETWORK=host``): for a machine without bridge
  networks (the demo and the tests run on a bridge network of their own).  A container on
  the host network shares the node's loopback with every other member's, and can listen on
  every interface of the node, so a member's code can take the proxy's, the hub's or the
  credits service's port while one of them restarts.
  With the hub off loopback it is refused unless ``GPUHUB_HOST_NETWORK_ACK=1`` says the
  operator accepts that risk.
- **Request bodies**: the hub's HTTP server reads at most :data:`HUB_MAX_BODY_BYTES` of a
  request body (:func:`limit_request_bodies`); tornado's default, 100 MiB, is held in memory
  before any handler checks a token.
- **Secret files** (``GPUHUB_SECRET_FILES``, and the TLS key): the hub refuses to start
  while another user may read or write one of them (mode bits ``0o007``, the rule
  JupyterHub applies to its cookie secret file).
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

from tornado.httpserver import HTTPServer

from ..login.hubconfig import split_list

#: The largest request body the hub reads, bytes.  The hub's own bodies are far smaller:
#: ``user_options`` at most 8 KiB (``SpawnerCore.user_options_max_bytes``), a reservation
#: 16 KiB, a course grant 4 KiB, JupyterHub's REST API a few KiB (a bulk user list of
#: thousands of names fits).  Members' uploads go to their own servers, not through the hub.
HUB_MAX_BODY_BYTES = 1024 * 1024


def is_loopback(ip: str) -> bool:
    """True for addresses only this machine can reach (``127.0.0.0/8``, ``::1``, localhost).

    An empty address means every interface (JupyterHub's convention): not loopback.
    """
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_secret_file(path: str, variable: str, *, readable: bool = False) -> None:
    """Refuse a secret file that is missing, or that other users may read or write.

    With ``readable``, the hub's own user must also be able to read it (the TLS key, which
    the proxy loads); a file that is only checked (a mounted ``.env``) need not be.  Raises
    ValueError naming ``variable``, the file, its mode and the fix.  Group bits are allowed:
    a key may be shared with the hub through its group.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"{variable} names {path}, which does not exist") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{variable} names {path}, which is not a file")
    if mode & 0o007:
        raise ValueError(
            f"{path} ({variable}) holds secrets and other users may read or write it "
            f"(mode {stat.S_IMODE(mode):04o}); the hub does not start until it is private: "
            f"`chmod 600` the file (in a docker-compose deployment: `chmod 600 .env` and the "
            f"TLS key, next to docker-compose.yml)"
        )
    if readable and not os.access(path, os.R_OK):
        raise ValueError(
            f"{path} ({variable}) cannot be read by the hub's user (uid {os.getuid()}); give "
            f"it to that user (`chown {os.getuid()} FILE`) and keep it mode 600"
        )


def check_host_network(settings) -> None:
    """Refuse host networking with the hub off loopback, unless acknowledged.

    Raises ValueError naming the risk and ``GPUHUB_HOST_NETWORK_ACK=1``.  On loopback the
    hub is a demo or a test (MACHINE.md: these machines have no bridge), so no flag is
    needed there.
    """
    if settings.docker_network != "host" or is_loopback(settings.ip):
        return
    if settings.host_network_ack:
        return
    raise ValueError(
        f"GPUHUB_DOCKER_NETWORK=host with GPUHUB_IP={settings.ip!r}: containers on the host "
        "network can listen on every interface of this machine and take the proxy's, the "
        "hub's or the credits service's port, and every member's loopback is everyone's. "
        "Use a Docker bridge network (GPUHUB_DOCKER_NETWORK=gpuhub), or set "
        "GPUHUB_HOST_NETWORK_ACK=1 to accept that risk (docs/explanation/security.md)"
    )


def limit_request_bodies(max_bytes: int = HUB_MAX_BODY_BYTES) -> None:
    """Make every tornado ``HTTPServer`` this process creates refuse bodies over ``max_bytes``.

    JupyterHub 6.1 makes its server in ``JupyterHub.start()`` with fixed arguments and no
    setting for the limit, and tornado reads a whole body before a handler authenticates it.
    ``HTTPServer`` is a tornado ``Configurable``: ``configure(None, **kwargs)`` adds keyword
    arguments to every later instance (arguments given explicitly still win).  A longer
    ``Content-Length`` is refused before the body is read (tornado closes the connection);
    a chunked body is cut off at the limit.  Called from the hub's configuration, before
    the hub starts its server; the hub's process serves nothing else.
    """
    HTTPServer.configure(None, max_body_size=max_bytes)


def apply_serving_config(c, settings) -> None:
    """Set the public address, TLS, the hub API and the proxy API from ``settings``.

    Raises ValueError, naming the variable and the fix, for plain HTTP off loopback without
    ``GPUHUB_ALLOW_HTTP=1``, a certificate without its key (or the reverse), a missing
    certificate, host networking off loopback without ``GPUHUB_HOST_NETWORK_ACK=1``, and a
    secret file (``GPUHUB_SECRET_FILES``, the key) that is missing or
    readable by other users.
    """
    c.JupyterHub.ip = settings.ip
    c.JupyterHub.port = settings.port
    if settings.ssl_cert or settings.ssl_key:
        if not (settings.ssl_cert and settings.ssl_key):
            missing = "GPUHUB_SSL_KEY" if settings.ssl_cert else "GPUHUB_SSL_CERT"
            raise ValueError(
                f"HTTPS needs both GPUHUB_SSL_CERT and GPUHUB_SSL_KEY; {missing} is empty"
            )
        if not Path(settings.ssl_cert).is_file():
            raise ValueError(f"GPUHUB_SSL_CERT names {settings.ssl_cert}, which does not exist")
        check_secret_file(settings.ssl_key, "GPUHUB_SSL_KEY", readable=True)
        c.JupyterHub.ssl_cert = settings.ssl_cert
        c.JupyterHub.ssl_key = settings.ssl_key
    elif not is_loopback(settings.ip) and not settings.allow_http:
        raise ValueError(
            f"GPUHUB_IP={settings.ip!r} would serve logins over plain HTTP. Set GPUHUB_SSL_CERT "
            "and GPUHUB_SSL_KEY (PEM files) to serve HTTPS, or GPUHUB_ALLOW_HTTP=1 when a TLS "
            "reverse proxy in front of the hub is the only way in (docs/howto/tls-reverse-proxy.md)"
        )
    for path in split_list(settings.secret_files):
        check_secret_file(path, "GPUHUB_SECRET_FILES")
    check_host_network(settings)

    c.JupyterHub.hub_ip = settings.hub_ip
    c.JupyterHub.hub_port = settings.hub_port
    if settings.hub_connect_ip:
        c.JupyterHub.hub_connect_ip = settings.hub_connect_ip
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.proxy_api_port}"
    limit_request_bodies()
