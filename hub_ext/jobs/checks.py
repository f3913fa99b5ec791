"""What a new notebook job must pass before anything is started or charged.

Every refusal is a :class:`JobRefused` with an HTTP status and a sentence for the member
(the REST answer's ``message``); nothing is stored, copied, started or debited before all
checks pass.  :func:`hub_ext.jobs.lifecycle.create` asks what is cheap first, so that a
request refused for its body, its size, the per-member limit or the profile never makes
the hub open the notebook, and one refused for its notebook never makes it write to its
database:

- :func:`read_request`: the body, Jupyter Scheduler's ``CreateJob`` (400);
- the job's ``user_options`` at most ``user_options_max_bytes`` (413; the lifecycle);
- the per-member limit (``GPUHUB_JOBS_PER_USER``, 409; the lifecycle);
- :func:`job_profile`: the profile exists (404), is open to the member (403: the spawn
  page's rule, :func:`hub_ext.spawn.profiles.visible_profiles`) and runs jobs (403);
- :func:`open_notebook`: the input is a workspace-relative path (400) to a regular file
  inside the workspace, every component opened without following a link (403: a symbolic
  link anywhere on the way, as :mod:`hub_ext.spawn.member_dirs` opens folders), at most
  ``GPUHUB_JOB_NOTEBOOK_MAX_MIB`` (413, from its size before anything is read);
- :func:`notebook_refusal`: it reads as a notebook (400: nbformat 4 JSON, not nested
  deeper than a parser goes), checked apart from the hub's event loop
  (:mod:`hub_ext.jobs.intake`);
- the first interval's price (402, the credits hook's own ``before_reserve``: the same
  sentence as for a server; the lifecycle, which makes the job's server to ask it).
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..spawn.profiles import ProfileError, jobs_allowed, quote, select_profile
from .notebook_check import read_all, verdict

__all__ = [
    "OUTPUT_FORMATS",
    "JobRefused",
    "JobRequest",
    "check_notebook",
    "job_profile",
    "notebook_refusal",
    "open_notebook",
    "read_notebook",
    "read_open",
    "read_request",
]

#: formats a job writes besides its log
OUTPUT_FORMATS = ("ipynb", "html")
#: the most parameters a job takes, and the longest key and value (characters)
MAX_PARAMETERS, MAX_KEY, MAX_VALUE = 100, 100, 1000
#: the longest job name and idempotency token (characters)
MAX_NAME = 255


class JobRefused(Exception):
    """A job that cannot be created: ``status`` (HTTP) and ``message`` (for the member)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class JobRequest:
    """A ``CreateJob`` body, checked."""

    input_uri: str
    profile: str
    name: str = ""
    parameters: dict[str, str] = field(default_factory=dict)
    output_formats: list[str] = field(default_factory=lambda: ["ipynb"])
    idempotency_token: str | None = None


def _text(body: dict, key: str, required: bool = False, most: int = MAX_NAME) -> str | None:
    value = body.get(key)
    if value is None or (value == "" and not required):
        if required:
            raise JobRefused(400, f"{key} is missing: give it as a string.")
        return None
    if not isinstance(value, str) or not value.strip():
        raise JobRefused(400, f"{key} must be a non-empty string, not {quote(value)}.")
    if len(value) > most:
        raise JobRefused(400, f"{key} is {len(value)} characters long; at most {most}.")
    return value


def read_request(body) -> JobRequest:
    """Jupyter Scheduler's ``CreateJob`` (``input_uri``, ``runtime_environment_name``,
    ``name``, ``parameters``, ``output_formats``, ``idempotency_token``; other fields of
    the model are ignored) as a :class:`JobRequest`.  Raises :class:`JobRefused` (400)."""
    if not isinstance(body, dict):
        raise JobRefused(400, "The body must be a JSON object (Jupyter Scheduler's CreateJob).")
    input_uri = _text(body, "input_uri", required=True, most=1024)
    profile = _text(body, "runtime_environment_name", required=True)
    name = _text(body, "name") or ""
    token = _text(body, "idempotency_token")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise JobRefused(
            400,
            f"parameters must be a JSON object of strings, such as "
            f'{{"epochs": "3"}}, not {quote(parameters)}.',
        )
    if len(parameters) > MAX_PARAMETERS:
        raise JobRefused(400, f"{len(parameters)} parameters; at most {MAX_PARAMETERS}.")
    for key, value in parameters.items():
        if not key.isidentifier() or len(key) > MAX_KEY:
            raise JobRefused(
                400, f"The parameter name {quote(key)} is not a Python name (papermill sets it)."
            )
        if not isinstance(value, str) or len(value) > MAX_VALUE:
            raise JobRefused(
                400,
                f"The parameter {key} must be a string of at most {MAX_VALUE} characters, "
                f"not {quote(value)}.",
            )
    formats = body.get("output_formats") or ["ipynb"]
    if not isinstance(formats, list) or not all(f in OUTPUT_FORMATS for f in formats):
        raise JobRefused(
            400,
            f"output_formats must be a list among {', '.join(OUTPUT_FORMATS)}, "
            f"not {quote(formats)}.",
        )
    formats = ["ipynb", *sorted(set(formats) - {"ipynb"})]  # the executed notebook always
    return JobRequest(input_uri, profile, name, dict(parameters), formats, token)


def job_profile(visible: list[dict], everything: list[dict], slug: str) -> dict:
    """The profile ``slug`` for a job of a member who sees ``visible`` (of ``everything``).
    Raises :class:`JobRefused`: 404 no such profile, 403 not open to the member or no
    jobs on it."""
    runs_jobs = sorted(p["slug"] for p in visible if jobs_allowed(p))
    choices = ", ".join(runs_jobs) or "(none)"
    if slug not in {p["slug"] for p in everything}:
        raise JobRefused(404, f"No such environment: {quote(slug)}. Options include: {choices}.")
    try:
        profile = select_profile(visible, {"profile": slug}, everything).profile
    except ProfileError:
        raise JobRefused(
            403, f"The environment {slug!r} is not open to you. Options include: {choices}."
        ) from None
    if not jobs_allowed(profile):
        raise JobRefused(
            403,
            f"The environment {slug!r} does not run notebook jobs. Options include: {choices}.",
        )
    return profile


def relative_path(path: str) -> list[str]:
    """``path`` as the names of its components, for a path inside the workspace.
    Raises :class:`JobRefused` (400) for an absolute path, ``..`` or an empty name."""
    if "\x00" in path or path.startswith("/") or "\\" in path:
        raise JobRefused(
            400, f"{quote(path)} is not a path inside your workspace (give it relative to it)."
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise JobRefused(400, f"{quote(path)} leaves your workspace; give a path inside it.")
    return parts


#: how a folder and a file in a member's workspace are opened: never through a link
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def open_in(workspace: str, parts: list[str]) -> int:
    """A read-only descriptor of the file ``parts`` (:func:`relative_path`) in
    ``workspace``, each folder on the way opened relative to its parent's descriptor with
    ``O_NOFOLLOW``.  Raises :class:`OSError` (ELOOP or ENOTDIR for a link on the way)."""
    fds = [os.open(workspace, DIR_FLAGS)]
    try:
        for name in parts[:-1]:
            fds.append(os.open(name, DIR_FLAGS, dir_fd=fds[-1]))
        return os.open(parts[-1], _FILE, dir_fd=fds[-1])
    finally:
        for d in fds:
            os.close(d)


def open_notebook(workspace: str, path: str, max_bytes: int) -> int:
    """A read-only descriptor of the notebook at ``path`` (relative) in the folder
    ``workspace``; the caller closes it.

    Each component is opened relative to its parent's descriptor with ``O_NOFOLLOW``: a
    symbolic link anywhere on the way is refused, whatever it points to, so a member's
    link cannot make the hub read a file outside the workspace.  Blocking (the hub calls
    it in a thread); nothing is read here.  Raises :class:`JobRefused`: 400 for a path
    that leaves the workspace or a name without ``.ipynb``, 403 for a link or a
    non-regular file, 404 for a missing file, 413 for one over ``max_bytes`` (from its
    size).
    """
    parts = relative_path(path)
    if not parts[-1].endswith(".ipynb"):
        raise JobRefused(400, f"{quote(path)} is not a notebook (a .ipynb file).")
    try:
        fd = open_in(workspace, parts)
    except FileNotFoundError:
        raise JobRefused(404, f"{quote(path)} is not in your workspace.") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise JobRefused(
                403,
                f"{quote(path)} goes through a link or something that is not a folder; "
                "give the path of the notebook itself, inside your workspace.",
            ) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise JobRefused(403, f"{quote(path)} is not a regular file.")
        if info.st_size > max_bytes:
            raise JobRefused(
                413,
                f"{quote(path)} is {info.st_size / 2**20:.1f} MiB; a job takes notebooks "
                f"of at most {max_bytes / 2**20:g} MiB. Clear its outputs and try again.",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_open(fd: int, path: str, max_bytes: int) -> bytes:
    """The bytes of the notebook open as ``fd`` (:func:`open_notebook`), from its start
    (``os.pread``: the descriptor's offset is left alone).  Blocking.  Raises
    :class:`JobRefused` (413) when it grew over ``max_bytes``."""
    data = read_all(fd, max_bytes)
    if len(data) > max_bytes:
        raise JobRefused(413, f"{quote(path)} is larger than {max_bytes / 2**20:g} MiB.")
    return data


def read_notebook(workspace: str, path: str, max_bytes: int) -> bytes:
    """The bytes of the notebook at ``path`` in ``workspace``: :func:`open_notebook`, then
    :func:`read_open`; not parsed (:func:`check_notebook`).  Blocking."""
    fd = open_notebook(workspace, path, max_bytes)
    try:
        return read_open(fd, path, max_bytes)
    finally:
        os.close(fd)


def notebook_refusal(found: str, path: str) -> JobRefused | None:
    """The refusal of a notebook whose check (:func:`hub_ext.jobs.notebook_check.verdict`)
    found ``found``, or None for ``"ok"``: 400 for a file that is not a notebook or nests
    too deeply to be one, 413 for one too large to check."""
    if found == "ok":
        return None
    if found == "nested":
        return JobRefused(
            400,
            f"{quote(path)} nests lists or objects too deeply to be a notebook; open it in "
            "JupyterLab and save it again.",
        )
    if found == "too_big":
        return JobRefused(
            413, f"{quote(path)} takes more memory to read than a notebook job may take."
        )
    return JobRefused(
        400,
        f"{quote(path)} does not read as a notebook (nbformat 4 JSON); open it in "
        "JupyterLab and save it again.",
    )


def check_notebook(data: bytes, path: str) -> None:
    """Raise :class:`JobRefused` unless ``data`` is a notebook (:func:`notebook_refusal`),
    checked in this process (the hub checks in a child process:
    :func:`hub_ext.jobs.intake.load_notebook`)."""
    refusal = notebook_refusal(verdict(data), path)
    if refusal is not None:
        raise refusal


def output_names(input_path: str, job_id: str, created_ms: int, formats: list[str]):
    """``(output_dir, {format: file}, input copy)``, workspace-relative, as Jupyter
    Scheduler names them: ``jobs/<stem>-<job id>/<stem>-<time>.<format>`` (its
    ``create_output_directory`` and ``create_output_filename``) and ``.log`` for the log."""
    stem = posixpath.splitext(posixpath.basename(input_path))[0]
    out = f"jobs/{stem}-{job_id}"
    stamp = datetime.fromtimestamp(created_ms / 1000, UTC).strftime("%Y-%m-%d-%I-%M-%S-%p")
    outputs = {fmt: f"{out}/{stem}-{stamp}.{fmt}" for fmt in formats}
    outputs["log"] = f"{out}/{stem}-{stamp}.log"
    return out, outputs, f"{out}/input/{posixpath.basename(input_path)}"
