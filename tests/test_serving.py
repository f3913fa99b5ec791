"""How the hub faces the network (hub_ext/ops/serving.py), through apply_config: HTTPS from a
certificate, plain HTTP only on loopback or when said explicitly, secret files kept private,
the hub API where the servers can reach it."""

from __future__ import annotations

import os

import pytest

from tests.fixtures.tls import self_signed
from tests.test_config import OIDC, configure


@pytest.fixture
def tls(tmp_path):
    """A self-signed certificate and its key (mode 600), as PEM files."""
    self_signed(tmp_path, "hub.example.org")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    return {"GPUHUB_SSL_CERT": str(cert), "GPUHUB_SSL_KEY": str(key)}


def test_https_from_the_certificate_and_key(tmp_path, monkeypatch, tls):
    c = configure(tmp_path, monkeypatch, **OIDC, **tls, GPUHUB_IP="0.0.0.0")
    assert (c.JupyterHub.ip, c.JupyterHub.port) == ("0.0.0.0", 8000)
    assert c.JupyterHub.ssl_cert == tls["GPUHUB_SSL_CERT"]
    assert c.JupyterHub.ssl_key == tls["GPUHUB_SSL_KEY"]


@pytest.mark.parametrize("ip", ["0.0.0.0", "", "192.0.2.10", "hub.example.org"])
def test_plain_http_off_loopback_is_refused(tmp_path, monkeypatch, ip):
    with pytest.raises(ValueError, match="GPUHUB_ALLOW_HTTP=1") as e:
        configure(tmp_path, monkeypatch, **OIDC, GPUHUB_IP=ip)
    assert "GPUHUB_SSL_CERT" in str(e.value)


@pytest.mark.parametrize("ip", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_plain_http_on_loopback_needs_no_flag(tmp_path, monkeypatch, ip):
    c = configure(tmp_path, monkeypatch, **OIDC, GPUHUB_IP=ip)
    assert "ssl_cert" not in c.JupyterHub


def test_plain_http_behind_a_tls_proxy_when_said_explicitly(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, **OIDC, GPUHUB_IP="0.0.0.0", GPUHUB_ALLOW_HTTP="1")
    assert c.JupyterHub.ip == "0.0.0.0"
    assert "ssl_cert" not in c.JupyterHub


def test_allow_http_takes_only_0_or_1(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="GPUHUB_ALLOW_HTTP='yes': use 1"):
        configure(tmp_path, monkeypatch, **OIDC, GPUHUB_ALLOW_HTTP="yes")


def test_certificate_without_key_names_the_missing_one(tmp_path, monkeypatch, tls):
    with pytest.raises(ValueError, match="GPUHUB_SSL_KEY is empty"):
        configure(tmp_path, monkeypatch, **OIDC, GPUHUB_SSL_CERT=tls["GPUHUB_SSL_CERT"])
    with pytest.raises(ValueError, match="GPUHUB_SSL_CERT is empty"):
        configure(tmp_path, monkeypatch, **OIDC, GPUHUB_SSL_KEY=tls["GPUHUB_SSL_KEY"])
    with pytest.raises(ValueError, match="GPUHUB_SSL_CERT names .*nope.pem, which does not"):
        configure(tmp_path, monkeypatch, **OIDC, **{**tls, "GPUHUB_SSL_CERT": "/nope.pem"})


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o601])
def test_key_readable_or_writable_by_others_is_refused(tmp_path, monkeypatch, tls, mode):
    os.chmod(tls["GPUHUB_SSL_KEY"], mode)
    with pytest.raises(ValueError, match=rf"GPUHUB_SSL_KEY.*mode {mode:04o}.*chmod 600"):
        configure(tmp_path, monkeypatch, **OIDC, **tls)


def test_secret_files_must_be_private(tmp_path, monkeypatch):
    env_file = tmp_path / "env"
    env_file.write_text("JUPYTERHUB_CRYPT_KEY=00\n")
    env_file.chmod(0o640)  # group bits are allowed; the hub need not read it
    configure(tmp_path, monkeypatch, **OIDC, GPUHUB_SECRET_FILES=str(env_file))
    env_file.chmod(0o644)
    with pytest.raises(ValueError, match=r"GPUHUB_SECRET_FILES\) holds secrets .*mode 0644"):
        configure(tmp_path, monkeypatch, **OIDC, GPUHUB_SECRET_FILES=str(env_file))
    with pytest.raises(ValueError, match="GPUHUB_SECRET_FILES names /no/such/.env, which does"):
        configure(tmp_path, monkeypatch, **OIDC, GPUHUB_SECRET_FILES="/no/such/.env")


def test_hub_api_and_proxy_api(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, **OIDC)
    assert (c.JupyterHub.hub_ip, c.JupyterHub.hub_port) == ("127.0.0.1", 8081)
    assert "hub_connect_ip" not in c.JupyterHub
    assert c.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:8001"
    c = configure(
        tmp_path,
        monkeypatch,
        **OIDC,
        GPUHUB_HUB_IP="0.0.0.0",
        GPUHUB_HUB_PORT="9081",
        GPUHUB_HUB_CONNECT_IP="pod",
        GPUHUB_PROXY_API_PORT="9001",
    )
    assert (c.JupyterHub.hub_ip, c.JupyterHub.hub_port) == ("0.0.0.0", 9081)
    assert c.JupyterHub.hub_connect_ip == "pod"
    assert c.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:9001"


def test_database_password_stays_out_of_the_url_setting(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        **OIDC,
        GPUHUB_DB_URL="postgresql+psycopg://hub@db.example.org:5432/jupyterhub",
        GPUHUB_DB_PASSWORD="p@ss/word",
    )
    assert c.JupyterHub.db_url == (
        "postgresql+psycopg://hub:p%40ss%2Fword@db.example.org:5432/jupyterhub"
    )
    with pytest.raises(ValueError, match="GPUHUB_DB_PASSWORD is set and the database URL has"):
        configure(
            tmp_path,
            monkeypatch,
            **OIDC,
            GPUHUB_DB_PASSWORD="x",
            GPUHUB_DB_URL="postgresql+psycopg://hub:old@db/jupyterhub",
        )


@pytest.mark.parametrize("ip", ["0.0.0.0", "192.0.2.10", "hub.example.org"])
def test_host_network_off_loopback_is_refused_naming_the_risk(tmp_path, monkeypatch, ip):
    with pytest.raises(ValueError, match="GPUHUB_HOST_NETWORK_ACK=1") as e:
        configure(
            tmp_path,
            monkeypatch,
            **OIDC,
            GPUHUB_IP=ip,
            GPUHUB_ALLOW_HTTP="1",
            GPUHUB_DOCKER_NETWORK="host",
        )
    assert "take the proxy's, the hub's or the credits service's port" in str(e.value)


def test_host_network_off_loopback_when_acknowledged(tmp_path, monkeypatch):
    c = configure(
        tmp_path,
        monkeypatch,
        **OIDC,
        GPUHUB_IP="0.0.0.0",
        GPUHUB_ALLOW_HTTP="1",
        GPUHUB_DOCKER_NETWORK="host",
        GPUHUB_HOST_NETWORK_ACK="1",
    )
    assert c.GPUDockerSpawner.network_name == "host"


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "localhost"])
def test_host_network_on_loopback_needs_no_acknowledgement(tmp_path, monkeypatch, ip):
    c = configure(tmp_path, monkeypatch, **OIDC, GPUHUB_IP=ip, GPUHUB_DOCKER_NETWORK="host")
    assert c.GPUDockerSpawner.network_name == "host"


def test_a_bridge_network_off_loopback_needs_no_acknowledgement(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, **OIDC, GPUHUB_IP="0.0.0.0", GPUHUB_ALLOW_HTTP="1")
    assert c.GPUDockerSpawner.network_name == "gpuhub"
