"""apply_config on a fresh Config: what a site's environment turns into."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from hub_ext.config import Settings, apply_config


def configure(tmp_path, monkeypatch, **env):
    for key in list(__import__("os").environ):
        if key.startswith("GPUHUB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GPUHUB_STATE_DIR", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    c = Config()
    apply_config(c, Settings.from_env())
    return c


def test_defaults_are_production_shaped(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch)
    assert c.JupyterHub.spawner_class == "hub_ext.spawner.GPUDockerSpawner"
    assert c.GPUPool.inventory_class == "nvml"
    assert c.GPUDockerSpawner.network_name == "gpuhub"  # a bridge network
    assert "host_network" not in c.GPUDockerSpawner
    assert c.JupyterHub.db_url == f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    assert "authenticator_class" not in c.JupyterHub  # no demo login by default


def test_host_network_sets_what_docker_needs(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_DOCKER_NETWORK="host")
    s = c.GPUDockerSpawner
    assert (s.host_network, s.network_name, s.use_internal_ip, s.ip) == (
        True, "host", True, "127.0.0.1")


def test_simulated_gpus_are_explicit(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_GPUS="simulated:2")
    assert c.GPUPool.inventory_class == "simulated"
    assert c.GPUPool.simulated_devices == "2"


def test_unknown_gpu_source_is_an_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="GPUHUB_GPUS='fake'"):
        configure(tmp_path, monkeypatch, GPUHUB_GPUS="fake")


def test_demo_login_only_on_loopback(tmp_path, monkeypatch):
    c = configure(tmp_path, monkeypatch, GPUHUB_DEMO_LOGIN="1")
    assert c.JupyterHub.authenticator_class == "hub_ext.auth.DemoAuthenticator"
    with pytest.raises(ValueError, match="only runs on loopback"):
        configure(tmp_path, monkeypatch, GPUHUB_DEMO_LOGIN="1", GPUHUB_IP="0.0.0.0")


def test_demo_authenticator_refuses_to_load_without_the_switch(monkeypatch):
    from hub_ext.auth import DemoAuthenticator

    monkeypatch.delenv("GPUHUB_DEMO_LOGIN", raising=False)
    with pytest.raises(RuntimeError, match="demos only"):
        DemoAuthenticator()


def test_malformed_number_names_the_variable(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="GPUHUB_PORT='eighty'"):
        configure(tmp_path, monkeypatch, GPUHUB_PORT="eighty")
