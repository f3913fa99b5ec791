"""Whether some bytes are a Jupyter notebook: the one check of a job's input that parses it.

Standard library only, so that it runs as a script in a child process of the hub
(:func:`hub_ext.jobs.intake.check_notebook_apart`): parsing a notebook of 20 MiB holds
Python's GIL for as long as it takes, so a thread of the hub would stall the hub's event
loop as much as the loop itself; a child process does not, and its memory and CPU time are
bounded (``RLIMIT_AS``, ``RLIMIT_CPU``).  Run as a script it reads the notebook on stdin and
writes one of the :data:`VERDICTS` on stdout.
"""

from __future__ import annotations

import json
import sys

__all__ = ["VERDICTS", "verdict"]

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


def _limit(size: int) -> None:
    """Bound this process: address space from the notebook's ``size``, CPU time."""
    import resource

    memory = max(MEMORY_FLOOR, MEMORY_PER_BYTE * size)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def main() -> int:
    data = sys.stdin.buffer.read()
    _limit(len(data))
    sys.stdout.write(verdict(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
