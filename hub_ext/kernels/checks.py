"""What a new GPU kernel must pass before anything is started or charged.

Every refusal is a :class:`KernelRefused` with an HTTP status and a sentence for the member
(the REST answer's ``message``); nothing is stored, started or debited before all checks
pass (:func:`hub_ext.kernels.lifecycle.create` runs them first).

- :func:`read_request`: the body ``{"profile", "notebook", "cwd", "connection_dir"}``,
  strings only (400; a ``user`` or ``parent`` other than the request's own: 403);
- :func:`kernel_profile`: the profile exists and offers GPU kernels (404, naming those
  that do) and is open to the member (403: the spawn page's rule,
  :func:`hub_ext.spawn.profiles.visible_profiles`);
- :func:`check_connection_dir`: the connection folder is a folder of the member's own
  inside her workspace, under ``.gpuhub/kernels/``, that no one else may enter (mode
  0700), every component opened without following a link (403).

The per-member limits (``GPUHUB_KERNELS_PER_USER``; the GPUs she holds or waits for, 409),
the hub's server limits (429) and the first interval's price (402) are asked by the
lifecycle, which has the spawner.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from ..jobs.checks import DIR_FLAGS, JobRefused, relative_path
from ..spawn.profiles import ProfileError, kernels_allowed, quote, select_profile

__all__ = [
    "CONNECTION_ROOT",
    "KernelRefused",
    "KernelRequest",
    "check_connection_dir",
    "kernel_profile",
    "read_request",
]

#: where, in the workspace, the connection folders of GPU kernels are
CONNECTION_ROOT = ".gpuhub/kernels"
#: the fields of a request, and the longest value of each (characters)
FIELDS = {"profile": 255, "notebook": 1024, "cwd": 1024, "connection_dir": 1024}
#: fields that name who the kernel is for: accepted when they name the request's own
OWN = ("user", "parent")


class KernelRefused(Exception):
    """A kernel that cannot be created: ``status`` (HTTP) and ``message`` (for the member)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class KernelRequest:
    """A checked request: the profile's slug and workspace-relative paths (``cwd`` ""
    is the workspace itself)."""

    profile: str
    notebook: str
    cwd: str
    connection_dir: str


def _workspace_path(value: str, key: str, empty_ok: bool) -> str:
    """``value`` as a normalised workspace-relative path.  Raises :class:`KernelRefused`."""
    if value in ("", ".") and empty_ok:
        return ""
    try:
        return "/".join(relative_path(value))
    except JobRefused as e:
        raise KernelRefused(400, f"{key}: {e.message}") from None


def read_request(body, member: str, parent: str) -> KernelRequest:
    """The body of ``POST /hub/api/gpuhub/kernels`` as a :class:`KernelRequest`.

    ``member`` and ``parent`` are whom the request comes from (its user, and the server
    whose token it carries); a ``user`` or ``parent`` field naming anyone else is refused
    with 403.  Raises :class:`KernelRefused` (400, 403)."""
    if not isinstance(body, dict):
        raise KernelRefused(
            400,
            'The body must be a JSON object: {"profile", "notebook", "cwd", "connection_dir"}.',
        )
    unknown = sorted(set(body) - set(FIELDS) - set(OWN))
    if unknown:
        raise KernelRefused(
            400,
            f"Unexpected field(s) {', '.join(quote(k) for k in unknown[:5])}. "
            f"Accepted: {', '.join(FIELDS)}.",
        )
    for key, own in (("user", member), ("parent", parent)):
        if key in body and body[key] != own:
            raise KernelRefused(
                403,
                "A GPU kernel is started by its member's own server, for that server only: "
                f"{key} {quote(body[key])} is not this request's.",
            )
    values = {}
    for key, most in FIELDS.items():
        value = body.get(key, "")
        if not isinstance(value, str):
            raise KernelRefused(400, f"{key} must be a string, not {quote(value)}.")
        if len(value) > most:
            raise KernelRefused(400, f"{key} is {len(value)} characters long; at most {most}.")
        if "\x00" in value:
            raise KernelRefused(400, f"{key} holds a NUL character.")
        values[key] = value
    if not values["profile"]:
        raise KernelRefused(400, "profile is missing: give the slug of a GPU kernel's profile.")
    connection_dir = _workspace_path(values["connection_dir"], "connection_dir", False)
    if not connection_dir.startswith(CONNECTION_ROOT + "/") or connection_dir.count("/") != 2:
        raise KernelRefused(
            400,
            f"connection_dir must be a folder of its own under {CONNECTION_ROOT}/ in your "
            f"workspace, not {quote(values['connection_dir'])}.",
        )
    return KernelRequest(
        profile=values["profile"],
        notebook=_workspace_path(values["notebook"], "notebook", True),
        cwd=_workspace_path(values["cwd"], "cwd", True),
        connection_dir=connection_dir,
    )


def kernel_profile(visible: list[dict], everything: list[dict], slug: str) -> dict:
    """The profile ``slug`` for a GPU kernel of a member who sees ``visible`` (of
    ``everything``).  Raises :class:`KernelRefused`: 404 no such profile, or one that
    offers no GPU kernels (naming those that do); 403 not open to the member."""
    offered = sorted(p["slug"] for p in visible if kernels_allowed(p))
    choices = ", ".join(offered) or "(none)"
    profile = next((p for p in everything if p["slug"] == slug), None)
    if profile is None:
        raise KernelRefused(404, f"No such GPU kernel: {quote(slug)}. Options include: {choices}.")
    if not kernels_allowed(profile):
        raise KernelRefused(
            404,
            f"The profile {slug!r} offers no GPU kernels. Options include: {choices}.",
        )
    try:
        return select_profile(visible, {"profile": slug}, everything).profile
    except ProfileError:
        raise KernelRefused(
            403, f"The profile {slug!r} is not open to you. Options include: {choices}."
        ) from None


def check_connection_dir(workspace: str, path: str, uid: int) -> None:
    """Refuse unless ``path`` (from :func:`read_request`) is a folder in ``workspace``
    owned by ``uid`` with no access for group or others, each component opened relative
    to its parent with ``O_NOFOLLOW`` (a symbolic link anywhere on the way is refused,
    whatever it points to).  Raises :class:`KernelRefused` (400 missing, 403 otherwise)."""
    fds = [os.open(workspace, DIR_FLAGS)]
    try:
        for name in path.split("/"):
            try:
                fds.append(os.open(name, DIR_FLAGS, dir_fd=fds[-1]))
            except FileNotFoundError:
                raise KernelRefused(
                    400, f"The connection folder {path} is not in your workspace: make it first."
                ) from None
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise KernelRefused(
                        403,
                        f"The connection folder {path} goes through a link or something that "
                        "is not a folder.",
                    ) from None
                raise
        info = os.fstat(fds[-1])
    finally:
        for fd in fds:
            os.close(fd)
    if info.st_uid != uid or stat.S_IMODE(info.st_mode) & 0o077:
        raise KernelRefused(
            403,
            f"The connection folder {path} must be yours alone (mode 0700): a GPU kernel's "
            "channels are reached through it.",
        )
