"""Every setting the hub reads, declared once: its environment variable, type, default,
the part of the hub that reads it, a one-line help and whether it is a secret.

The rows are in :mod:`hub_ext.settings.rows`; from them come :class:`Settings` (the object
``apply_config(c, settings)`` reads), the parsing and validation of the environment
(:func:`read`), ``gpuhub config show|check`` (:mod:`hub_ext.config_cli`) and the settings
reference page (``docs/_ext/gpuhub_settings.py``).  Docs: reference/settings.

A malformed value is an error naming the variable, the value's first characters (never a
secret's) and what is allowed; a ``GPUHUB_*`` variable that no row declares is named in a
warning with the closest declared name, since a typo would otherwise fall back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends import BACKENDS as REGISTERED

REPO = Path(__file__).resolve().parent.parent.parent

#: What reads a setting: a section of the reference page each (a backend's own, as it is
#: registered in :data:`hub_ext.backends.BACKENDS`).
BACKENDS = {
    "core": "Core (both backends)",
    **{name: registered.title for name, registered in REGISTERED.items()},
    "credits": "Credits service and `gpuhub credits`",
    "compose": "docker-compose.yml only",
}

#: Variables the project's own scripts and tests read, not the hub (no warning for them).
NOT_SETTINGS = frozenset(
    {
        "GPUHUB_CACHE",
        "GPUHUB_CHROMIUM",
        "GPUHUB_DEMO_OIDC_PORT",
        "GPUHUB_DOCS_SCREENSHOTS",
        "GPUHUB_GPU_STANDIN",
        "GPUHUB_HOOK_LOG",
        "GPUHUB_IMAGE_NAMESPACE",
        "GPUHUB_IMAGE_SOURCE",
        "GPUHUB_JOB",  # a notebook job's container: the job (hub_ext.spawn.core)
        "GPUHUB_JOB_ROOT",
        "GPUHUB_JOB_EXIT_AFTER_REPORT",  # a job's runner exits once reported (spawn.core)
        "GPUHUB_KERNEL",  # a GPU kernel's container: the kernel (hub_ext.spawn.core)
        "GPUHUB_WORKSPACE_MOUNT",  # every container: where its workspace is (spawn.core)
        "GPUHUB_KERNEL_TRANSPORT",  # every server: how it reaches GPU kernels (spawn.core)
        "GPUHUB_SLURMD_TIMEOUT",
        "GPUHUB_SLURM_BRIDGE",
        "GPUHUB_SLURM_DBD",
        "GPUHUB_SLURM_DIR",
        "GPUHUB_SLURM_NODES",
        "GPUHUB_SLURM_NS_PREFIX",
        "GPUHUB_SLURM_PORT",
        "GPUHUB_SLURM_SCHEDULER_PARAMETERS",
        "GPUHUB_SLURM_SUBNET",
        "GPUHUB_SLURM_VETH",
        "GPUHUB_VENV",
        "GPUHUB_WHEELHOUSE",
    }
)
NOT_SETTINGS_PREFIX = "GPUHUB_TEST_"

log = logging.getLogger("JupyterHub")  # the hub's own logger when the hub loads its config


# -- types ---------------------------------------------------------------------------------


class Kind:
    """A setting's type: :meth:`parse` turns the variable's text (stripped, not empty) into
    the value, or raises ValueError with what is allowed; ``allowed`` is that phrase."""

    allowed = "any text"
    doc = ""

    def parse(self, text: str) -> Any:
        return text

    def __str__(self) -> str:
        """What the reference page's type column says."""
        return self.doc or self.allowed.removeprefix("use ")


class Text(Kind):
    def __init__(self, allowed: str = "any text"):
        self.allowed = allowed


class Int(Kind):
    """A whole number within ``low``..``high`` (None: unbounded); ``unit`` for the docs."""

    def __init__(self, low: int | None = 0, high: int | None = None, unit: str = ""):
        self.low, self.high, self.unit = low, high, unit
        self.allowed = (
            f"a whole number {low}..{high}"
            if high is not None
            else f"{low} or a larger whole number"
            if low is not None
            else "a whole number"
        ) + (f" ({unit})" if unit else "")

    def parse(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(self.allowed) from None
        if (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        ):
            raise OutOfBounds(value, self.allowed)
        return value


class OutOfBounds(ValueError):
    """A number that parsed but lies outside its bounds: shown as a number, not a text."""

    def __init__(self, value: int, allowed: str):
        super().__init__(allowed)
        self.value = value


class Flag(Kind):
    """On or off, written as one of two words (``1``/``0``, or ``on``/``off``)."""

    def __init__(self, on: str = "1", off: str = "0"):
        self.on, self.off = on, off
        self.allowed = f"use {on} (on) or {off} (off)"

    def parse(self, text: str) -> bool:
        word = text.lower()
        if word not in (self.on, self.off):
            raise ValueError(self.allowed)
        return word == self.on


class Choice(Kind):
    def __init__(self, *choices: str):
        self.choices = choices
        quoted = [repr(c) for c in choices]
        self.allowed = "use " + ", ".join(quoted[:-1]) + " or " + quoted[-1]

    def parse(self, text: str) -> str:
        word = text.lower()
        if word not in self.choices:
            raise ValueError(self.allowed)
        return word


class URL(Kind):
    allowed = "must start with http:// or https://"
    doc = "http(s) URL"

    def parse(self, text: str) -> str:
        if not text.startswith(("http://", "https://")):
            raise ValueError(self.allowed)
        return text


class File(Kind):
    """A path; ``what`` the file holds (``JSON file``, ``PEM file``...) for the docs."""

    def __init__(self, what: str = "path"):
        self.allowed = what


class CommaList(Kind):
    """Kept as the text (its readers split it); empty items are allowed."""

    allowed = "comma-separated list"


class GPUSource(Kind):
    allowed = "use 'nvml', 'simulated:<count>' or 'simulated:<path to a JSON device list>'"

    def parse(self, text: str) -> str:
        if text != "nvml" and not (text.startswith("simulated:") and text[10:]):
            raise ValueError(self.allowed)
        return text


class CryptKeys(Kind):
    """JupyterHub's ``JUPYTERHUB_CRYPT_KEY``: ``;``-separated keys, each checked by
    JupyterHub's own rule (32 bytes, hex or base64; ``jupyterhub.crypto``)."""

    allowed = "use keys of 32 bytes, hex or base64-encoded, separated by ; (openssl rand -hex 32)"
    doc = "32-byte keys, hex or base64, ;-separated"

    def parse(self, text: str) -> str:
        from jupyterhub.crypto import _validate_key

        for key in filter(None, (k.strip() for k in text.split(";"))):
            try:
                _validate_key(key)
            except ValueError:
                raise ValueError(self.allowed) from None
        return text


class JSONText(Kind):
    allowed = "JSON"

    def parse(self, text: str) -> str:
        import json

        try:
            json.loads(text)
        except ValueError as e:
            raise ValueError(f"JSON ({e})") from None
        return text


# -- the declaration -----------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One row: ``name`` the variable, ``attr`` the :class:`Settings` attribute (None: not
    on it; read by JupyterHub, a service or docker-compose), ``default`` the value when
    unset or empty (None where the reader derives one; ``default_doc`` says how)."""

    name: str
    attr: str | None
    kind: Kind
    default: Any
    backend: str
    help: str
    secret: bool = False
    default_doc: str = ""
    #: a variable set to nothing means the empty value, not the default (an IP address:
    #: every interface)
    empty_is_value: bool = False

    def parse(self, text: str | None) -> Any:
        """The value of ``text`` (None, or empty: the default).  Raises SettingError."""
        if text is not None and not text.strip() and self.empty_is_value:
            return ""
        text = (text or "").strip()
        if not text:
            return self.default
        try:
            return self.kind.parse(text)
        except OutOfBounds as e:
            raise SettingError(f"{self.name}={e.value}: use {e}") from None
        except ValueError as e:
            shown = (
                "(a secret: not shown)"
                if self.secret
                else repr(text if len(text) <= 40 else text[:40] + "...")
            )
            allowed = str(e)
            allowed = allowed if allowed.startswith(("use ", "must ")) else "use " + allowed
            raise SettingError(f"{self.name}={shown}: {allowed}") from None

    def shown(self, value: Any) -> str:
        """``value`` as ``gpuhub config show`` prints it: a secret masked."""
        if self.secret and value not in ("", None):
            return "********"
        if isinstance(self.kind, Flag):
            return self.kind.on if value else self.kind.off
        return "" if value is None else str(value)


class SettingError(ValueError):
    """A malformed setting; ``str()`` names the variable, the value and what is allowed."""


def declared() -> tuple[Setting, ...]:
    """Every row (:data:`hub_ext.settings.rows.ROWS`), looked up at call time so a test may
    rename one."""
    from . import rows as settings_rows

    return settings_rows.ROWS


def setting(name: str) -> Setting:
    """The row of variable ``name``; KeyError for an undeclared one."""
    for row in declared():
        if row.name == name:
            return row
    raise KeyError(name)


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One setting from ``environ`` (default ``os.environ``), parsed as declared: for the
    parts that run outside the hub (the credits service and CLI).  Raises SettingError."""
    environ = os.environ if environ is None else environ
    return setting(name).parse(environ.get(name))


def _settings_class() -> type:
    fields = [
        (r.attr, Any, dataclasses.field(default=r.default, repr=not r.secret))
        for r in declared()
        if r.attr
    ]
    return dataclasses.make_dataclass(
        "Settings",
        fields,
        namespace={
            "__doc__": "Everything a site sets, one attribute per row of hub_ext.settings.rows "
            "(docs: reference/settings).  ``Settings.from_env()`` reads them.",
            "__module__": __name__,
            "from_env": classmethod(lambda cls, environ=None: from_env(environ, cls)),
        },
    )


@dataclass
class Reading:
    """What :func:`read` found: the values, where each came from (``default``,
    ``environment`` or the .env file's path), the malformed ones, unknown variables with
    the closest declared name (or None), and the .env file's values that the environment
    overrides with another (``shadowed``: name -> (the file's text, the environment's))."""

    values: dict[str, Any]
    sources: dict[str, str]
    errors: list[str]
    unknown: dict[str, str | None]
    shadowed: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    dotenv_name: str = ".env"


def read(
    environ: Mapping[str, str], dotenv: Mapping[str, str] | None = None, dotenv_name: str = ".env"
) -> Reading:
    """Parse every declared variable: ``environ`` first, then ``dotenv`` (a .env file's
    values, as docker-compose passes them), then the default."""
    dotenv = dotenv or {}
    values, sources, errors, shadowed = {}, {}, [], {}
    for row in declared():
        if environ.get(row.name, "").strip() or (row.empty_is_value and row.name in environ):
            text, source = environ[row.name], "environment"
        elif (dotenv.get(row.name) or "").strip() or (row.empty_is_value and row.name in dotenv):
            text, source = dotenv[row.name] or "", dotenv_name
        else:
            text, source = None, "default"
        try:
            values[row.name] = row.parse(text)
        except SettingError as e:
            errors.append(str(e))
            values[row.name] = row.default
        sources[row.name] = source
        mine, theirs = (dotenv.get(row.name) or "").strip(), environ.get(row.name, "").strip()
        if mine and theirs and mine != theirs:
            shadowed[row.name] = (mine, theirs)
    unknown = unknown_variables([*environ, *dotenv])
    return Reading(values, sources, errors, unknown, shadowed, dotenv_name)


def unknown_variables(names) -> dict[str, str | None]:
    """``GPUHUB_*`` names no row declares -> the closest declared name (difflib), or None."""
    known = [r.name for r in declared()]
    # compared without the common prefix, which would make any two names look alike
    tails = [k.removeprefix("GPUHUB_") for k in known if k.startswith("GPUHUB_")]
    unknown = {}
    for name in names:
        if (
            name.startswith("GPUHUB_")
            and name not in known
            and name not in NOT_SETTINGS
            and not name.startswith(NOT_SETTINGS_PREFIX)
        ):
            close = difflib.get_close_matches(name.removeprefix("GPUHUB_"), tails, n=1, cutoff=0.6)
            unknown[name] = "GPUHUB_" + close[0] if close else None
    return unknown


def shadowed_error(name: str, texts: tuple[str, str], path: str) -> str:
    """A .env value the environment overrides, in words; a secret's values are not shown."""
    mine, theirs = texts
    row = next((r for r in declared() if r.name == name), None)
    if row is not None and row.secret:
        what = f"{name} in {path} has no effect: the hub's environment sets another value"
    else:
        what = (
            f"{name}={_first(mine)} in {path} has no effect: the hub's environment sets "
            f"{_first(theirs)}"
        )
    return (
        f"{what} (docker-compose.yml's environment: pins it, or the hub's container was "
        "made before the file changed; docs: reference/compose)"
    )


def _first(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"


def unknown_warning(name: str, closest: str | None) -> str:
    hint = f"did you mean {closest}?" if closest else "see docs: reference/settings"
    return f"{name} is not a setting of this hub and is ignored ({hint})"


def from_env(environ: Mapping[str, str] | None = None, cls: type | None = None):
    """:class:`Settings` from ``environ`` (default ``os.environ``).  Raises SettingError
    listing every malformed variable, one per line; logs a warning per unknown one."""
    reading = read(os.environ if environ is None else environ)
    if reading.errors:
        raise SettingError("\n".join(reading.errors))
    for name, closest in reading.unknown.items():
        log.warning("%s", unknown_warning(name, closest))
    return settings_of(reading, cls)


def settings_of(reading: Reading, cls: type | None = None):
    """The :class:`Settings` of a :func:`read` (its malformed values at their defaults),
    the state directory made absolute."""
    cls = cls or Settings
    settings = cls(**{r.attr: reading.values[r.name] for r in declared() if r.attr})
    settings.state_dir = Path(settings.state_dir).resolve()
    return settings


Settings = _settings_class()
