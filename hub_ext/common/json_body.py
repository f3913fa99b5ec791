"""Request bodies as JSON, for the hub's REST endpoints (jobs, reservations, course grants)
and the reference Credits API.

:func:`json.loads` raises :class:`RecursionError`, not :class:`ValueError`, for arrays or
objects nested deeper than the interpreter's recursion limit (``b"[" * 4000`` fits in any of
our body limits): a handler that catches only ``ValueError`` answers 500 and logs a
traceback for a forged body.
"""

from __future__ import annotations

import json

__all__ = ["parse_json"]


def parse_json(raw: bytes | str) -> object:
    """``raw`` as JSON.  Raises :class:`ValueError` for anything that is not JSON: bad
    syntax, bytes that are not UTF-8, nesting too deep for the parser."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
