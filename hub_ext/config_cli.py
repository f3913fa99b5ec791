"""``gpuhub config show|check``: the effective settings, and whether the hub would start.

    gpuhub config show  [--env-file .env]            every setting, its value, its source
    gpuhub config check [--env-file .env] [--reach]  exit 0 when the hub would start

With docker-compose, ``docker-compose run --rm check`` runs ``gpuhub config check
--env-file /etc/gpuhub/env --reach`` beside the hub, on ``.env`` as edited
(``docker-compose run --rm check --no-reach`` before the stack is up).

Both read the environment, then the ``.env`` file that ``gpuhub init`` writes and docker
compose passes to the hub (``env_file: .env``; read with python-dotenv), then the declared
defaults (:mod:`hub_ext.settings`).  Values set in docker-compose.yml's ``environment:``
are not seen.  Secrets are masked; no error repeats one.

``check`` gives the errors the hub would give, from the hub's own code: the settings'
parsing, :func:`hub_ext.config.apply_config` on a fresh ``Config`` (its state in a
temporary folder), the site additions (:mod:`hub_ext.ops.site_config`), the authenticator made
from that configuration (it refuses a login without issuer or client id), and the files the
settings name: the profile list (:func:`hub_ext.spawn.profiles.init_profiles`, as the spawn page
does), the datasets (the spawner's own ``datasets`` validation), the uid map (each entry
as a spawn reads it).  A ``GPUHUB_*`` variable that no setting declares is an error here
(the hub only warns).  ``--reach`` also asks, with short time-outs, whatever the settings
use: the OIDC provider's discovery document and whether it accepts the hub's client id
and secret (:mod:`hub_ext.login.reach`), the Credits API (with the hub's token), the
Docker engine, Slurm's controller (``scontrol ping``, on the submit host), and then
whether each profile can ever start on what the backend has (the Docker host's memory,
CPUs and GPUs; the memory, CPUs and GPUs of the nodes of a profile's Slurm partition).
Docs: reference/cli, how-to/check-settings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from .backends import backend, reason
from .settings import (
    BACKENDS,
    Reading,
    declared,
    read,
    settings_of,
    shadowed_error,
    unknown_warning,
)

TIMEOUT = 5  # seconds, for each --reach question


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    for name, help_ in (
        ("show", "print every setting, its value and where it came from"),
        (
            "check",
            "validate the settings and the files they name; exit 1 when the hub would not start",
        ),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument(
            "--env-file",
            default=None,
            help="the .env file to read (default: ./.env when it exists)",
        )
        if name == "check":
            p.add_argument(
                "--reach",
                action=argparse.BooleanOptionalAction,
                default=False,
                help="also ask the OIDC provider, the Credits API, the Docker "
                "engine or Slurm's controller, as the settings use them, and check each "
                "profile against what the backend has (--no-reach: do not; the default)",
            )
    parser.set_defaults(func=config)


def config(args) -> int:
    try:
        reading = read_settings(args.env_file)
    except OSError as e:
        print(f"gpuhub config: {e}", file=sys.stderr)
        return 1
    if args.config_command == "show":
        return show(reading)
    return check(reading, reach=args.reach)


def read_settings(env_file: str | None) -> Reading:
    """:func:`hub_ext.settings.read` of the environment and the .env file.  Raises OSError
    when ``env_file`` was named and cannot be read."""
    path = Path(env_file or ".env")
    values: dict[str, str] = {}
    if env_file is not None or path.is_file():
        from dotenv import dotenv_values

        with open(path) as f:  # an OSError names the file
            values = {k: v or "" for k, v in dotenv_values(stream=f).items()}
    return read(os.environ, values, str(path))


def show(reading: Reading) -> int:
    """Print the settings grouped by what reads them; exit 1 when one is malformed."""
    rows = declared()
    width = max(len(r.name) for r in rows)
    for part, title in BACKENDS.items():
        print(f"# {title}")
        for r in (r for r in rows if r.backend == part):
            shown = r.shown(reading.values[r.name])
            if not shown and r.default_doc:
                shown = f"({r.default_doc})"
            print(f"{r.name:<{width}}  {shown:<40}  {reading.sources[r.name]}")
        print()
    for name, closest in reading.unknown.items():
        print(f"warning: {unknown_warning(name, closest)}", file=sys.stderr)
    for error in reading.errors:
        print(f"error: {error}", file=sys.stderr)
    return 1 if reading.errors else 0


def check(reading: Reading, reach: bool = False) -> int:
    """Print each problem on a line of its own; 0 when there is none, else 1."""
    problems = list(reading.errors)
    problems += [unknown_warning(n, c) for n, c in reading.unknown.items()]
    problems += [shadowed_error(n, t, reading.dotenv_name) for n, t in reading.shadowed.items()]
    if not reading.errors:
        settings = settings_of(reading)
        file_problems = check_files(settings)
        # the hub's configuration reads those files too: one error for each is enough
        problems += file_problems or check_hub_config(settings)
        if reach:
            problems += check_reach(settings)
    for p in problems:
        print(f"error: {p}")
    if problems:
        print(f"gpuhub config check: {len(problems)} problem(s)")
        return 1
    print(
        "gpuhub config check: the settings are good"
        + (" and every service answers" if reach else "")
    )
    return 0


def check_files(settings) -> list[str]:
    """The profile list, datasets, courses and uid map the settings name, read as the
    hub reads them."""
    from traitlets import TraitError

    from .config import load_profiles
    from .spawn.profiles import init_profiles

    problems = []
    if settings.profiles_file:
        try:
            init_profiles(
                load_profiles(settings.profiles_file), backend(settings.backend).profile_keys()
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"GPUHUB_PROFILES={settings.profiles_file}: {reason(e)}")
    if settings.datasets_file:
        from .spawn.mounts import MemberMounts

        try:
            with open(settings.datasets_file) as f:
                MemberMounts(datasets=json.load(f))
        except (OSError, ValueError, TraitError) as e:
            problems.append(f"GPUHUB_DATASETS={settings.datasets_file}: {reason(e)}")
    if settings.courses_file:
        from .courses import load_courses

        try:
            load_courses(settings.courses_file)
        except (OSError, ValueError) as e:
            problems.append(f"GPUHUB_COURSES: {reason(e)}")  # the message names the file
    problems += backend(settings.backend).check_files(settings)
    return problems


def check_hub_config(settings) -> list[str]:
    """What ``jupyterhub_config.py`` does, on a fresh Config with its state in a temporary
    folder: :func:`apply_config`, then the site additions."""
    from traitlets.config import Config

    from .config import apply_config
    from .ops.site_config import load_site_config

    c = Config()
    with tempfile.TemporaryDirectory(prefix="gpuhub-check-") as tmp:
        try:
            apply_config(c, replace(settings, state_dir=Path(tmp) / "state"))
        except Exception as e:  # noqa: BLE001 - what the hub would stop with
            return [f"the hub's configuration: {reason(e)}"]
        try:
            load_site_config(c, settings.config_dir)
        except Exception as e:  # noqa: BLE001
            return [f"site additions in {settings.config_dir}: {reason(e)}"]
        try:  # the authenticator checks its own settings when the hub makes it
            authenticator_class(c)(config=c)
        except Exception as e:  # noqa: BLE001
            return [f"the hub's login: {reason(e)}"]
    return []


def authenticator_class(c) -> type:
    """The class ``c.JupyterHub.authenticator_class`` names (a class or a dotted path)."""
    from traitlets.utils.importstring import import_item

    name = c.JupyterHub.authenticator_class
    return import_item(name) if isinstance(name, str) else name


def check_reach(settings) -> list[str]:
    """Ask each service the settings use; one problem per one that does not answer."""
    import httpx

    problems = []
    if settings.oidc_issuer:
        from .login.reach import check_provider

        problems += check_provider(settings, TIMEOUT)
    if settings.credits and settings.credits_url:
        url = settings.credits_url.rstrip("/") + "/v1/accounts/gpuhub-config-check"
        try:
            r = httpx.get(
                url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {settings.credits_token}"}
            )
            if r.status_code in (401, 403):
                problems.append(
                    f"GPUHUB_CREDITS_TOKEN: the Credits API at "
                    f"{settings.credits_url} refused it ({r.status_code})"
                )
            elif r.status_code not in (200, 404):
                problems.append(f"GPUHUB_CREDITS_URL: {url} answered {r.status_code}")
            else:
                print(f"ok: the Credits API ({settings.credits_url}) accepts the hub's token")
        except httpx.HTTPError as e:
            problems.append(f"GPUHUB_CREDITS_URL: {settings.credits_url}: {reason(e)}")
    part = backend(settings.backend)
    reached = part.reach(settings, TIMEOUT)
    problems += reached
    if not reached:  # the profiles, against what the backend has
        from .config import hub_profiles

        try:
            profiles = hub_profiles(settings, ask=True)
        except (OSError, ValueError):  # check_files names the file
            profiles = []
        problems += part.check_profiles(settings, profiles, TIMEOUT)
    return problems
