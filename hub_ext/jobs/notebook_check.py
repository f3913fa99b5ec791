"""Whether some bytes are a Jupyter notebook: the one check of a job's input that parses it.

Standard library only, so that it runs as a script in a child process of the hub
(:func:`hub_ext.jobs.intake.check_apart`): parsing a notebook of 20 MiB holds Python's
GIL for as long as it takes, so a thread of the hub would stall the hub's event loop as
much as the loop itself; a child process does not, and its memory and CPU time are bounded
(``RLIMIT_AS``, ``RLIMIT_CPU``) and its CPU priority the lowest (``nice -n 19``).  Run as a
script it reads the notebook itself, through the descriptor the hub opened (so nothing of
it goes through a pipe, and the hub reads a notebook only once it is known to be one), and
writes one of the :data:`VERDICTS` on stdout (:func:`main`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

__all__ = ["VERDICTS", "read_all", "verdict"]

#: ``ok``; ``not_json`` (not UTF-8 JSON); ``not_notebook`` (JSON without nbformat 4's
#: top-level keys); ``nested`` (nested too deeply to parse); ``too_big`` (more memory
#: than the check may take)
VERDICTS = ("ok", "not_json", "not_notebook", "nested", "too_big")
#: bytes of address space the check may take per byte of notebook, and at least
MEMORY_PER_BYTE, MEMORY_FLOOR = 40, 512 * 2**20
#: seconds of CPU time the check may take
CPU_SECONDS = 60


def verdict(data: bytes) -> str:
    """One of :data:`VERDICTS` for ``data``: a notebook is JSON with nbformat 4's top-level
    keys (``cells`` a list, ``metadata`` an object, ``nbformat`` 4)."""
    try:
        nb = json.loads(data)
    except RecursionError:  # "[[[[...": json's parser recurses once per level
        return "nested"
    except MemoryError:
        return "too_big"
    except (ValueError, UnicodeDecodeError):
        return "not_json"
    if (
        not isinstance(nb, dict)
        or nb.get("nbformat") != 4
        or not isinstance(nb.get("cells"), list)
        or not isinstance(nb.get("metadata"), dict)
    ):
        return "not_notebook"
    return "ok"


def read_all(fd: int, most: int) -> bytes:
    """The bytes of the file open as ``fd`` from its start, at most ``most + 1`` (one more
    than ``most`` says it is larger), with ``os.pread``: the offset of the descriptor, which
    a child shares with its parent, is left alone."""
    data = os.pread(fd, most + 1, 0)
    while data and len(data) <= most:
        chunk = os.pread(fd, most + 1 - len(data), len(data))
        if not chunk:
            break
        data += chunk
    return data


def _limit(most: int) -> None:
    """Bound this process: address space for a notebook of ``most`` bytes, CPU time (the
    hub starts it at the lowest CPU priority, ``nice``)."""
    import resource

    memory = max(MEMORY_FLOOR, MEMORY_PER_BYTE * most)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def main(argv: list[str]) -> int:
    """``notebook_check.py FD MOST``: the verdict on the file open as descriptor ``FD``
    (inherited from the hub) of at most ``MOST`` bytes, and the SHA-256 of the bytes it
    read (the hub copies the file only when its own read has the same), on stdout."""
    fd, most = int(argv[0]), int(argv[1])
    _limit(most)
    data = read_all(fd, most)
    found = "too_big" if len(data) > most else verdict(data)
    sys.stdout.write(f"{found} {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
