"""Folders the hub makes, as root, for a member: made and given to her without following a
link anyone but root made.

A member owns her workspace, so she can replace anything in it at any moment, e.g. swap a
folder the hub just made for a symbolic link to a root file (``renameat2(RENAME_EXCHANGE)``)
between the hub's ``mkdir`` and its ``chown``: a ``chown`` by path then gives her that
file.  Here every step works on an open directory descriptor instead: each component is
opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor, and the owner
and mode are set with ``fchown``/``fchmod`` on the descriptor of the folder that was
opened, whatever the name points to by then.  A symbolic link is followed only where
root made it in a folder root owns (a site's own layout, e.g. ``/cluster -> /mnt/lustre``);
anywhere else it is refused (:class:`MemberDirRefused`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

__all__ = ["MemberDirRefused", "member_dir"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class MemberDirRefused(Exception):
    """A folder on the way is a link the member controls, not a folder, or not hers."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def _open_child(parent: int, name: str, path: str) -> int:
    """Open ``name`` in the folder ``parent`` without following a link, except root's own
    link in a folder root owns."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        link = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(link.st_mode) and link.st_uid == 0 and os.fstat(parent).st_uid == 0:
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
        raise MemberDirRefused(path, "is a link or not a folder") from None


def member_dir(path: str, uid: int, gid: int, private: tuple[str, ...] = ()) -> bool:
    """Make sure ``path`` and ``path/<each of private>`` exist, owned by ``uid:gid``.

    Missing folders above ``path`` are made by root (mode 0755, root's).  ``path`` and
    each folder of ``private`` (the hub's own, e.g. ``.gpuhub``) are made when missing,
    and set to the member's owner and mode 0700 every time (private to her: other
    accounts on a cluster cannot read them).  Returns whether ``path`` was made.
    Raises :class:`MemberDirRefused` for a link or non-folder on the way, or when ``path``
    or a private folder belongs to another uid; OSError for other failures.
    """
    parts = [p for p in os.path.normpath(path).split("/") if p]
    if not path.startswith("/") or not parts:
        raise MemberDirRefused(path, "is not an absolute folder")
    fds = [os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    made = False
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            here = "/" + "/".join(parts[: i + 1])
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700 if last else 0o755, dir_fd=fds[-1])
                made = last
            fds.append(_open_child(fds[-1], name, here))
        workspace = fds[-1]
        owner = os.fstat(workspace).st_uid
        if not made and owner != uid:
            raise MemberDirRefused(path, f"belongs to uid {owner}")
        os.fchown(workspace, uid, gid)
        os.fchmod(workspace, 0o700)
        for name in private:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=workspace)
            fd = os.open(name, _DIR_FLAGS, dir_fd=workspace)  # a link: ELOOP, refused
            try:
                owner = os.fstat(fd).st_uid
                if owner not in (0, uid):  # 0: just made by the hub
                    raise MemberDirRefused(f"{path}/{name}", f"belongs to uid {owner}")
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        return made
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise MemberDirRefused(path, "a folder on the way is a link or not a folder") from None
        raise
    finally:
        for fd in fds:
            os.close(fd)
