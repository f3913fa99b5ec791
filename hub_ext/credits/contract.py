"""The Credits API contract's limits on what a request may carry (``openapi.yaml``, 1.1).

The client checks them before sending and the reference service before storing, so that
both follow the contract's schemas to the letter:

- ``username`` (path): 1 to 255 characters, none of them ``/`` or a control character
  (``^[^/\\x00-\\x1f\\x7f]+$``);
- ``reason``: a string of at most 500 characters, any of them (NUL and lone surrogates are
  valid JSON string content; the reference ledger stores them exactly); ``metadata``: at
  most 20 entries, each value a string of at most 500 characters; ``debit_id``: 1 to 255
  characters;
- amounts moved: :data:`hub_ext.credits.amounts.POSITIVE_AMOUNT_PATTERN`.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_ID",
    "MAX_METADATA_ENTRIES",
    "MAX_TEXT",
    "USERNAME_PATTERN",
    "metadata_problem",
    "reason_problem",
    "username_problem",
]

#: The ``username`` path parameter's pattern; matched with ``fullmatch`` (``$`` would
#: accept a trailing newline).
USERNAME_PATTERN = re.compile(r"[^/\x00-\x1f\x7f]+")
MAX_USERNAME = 255
MAX_TEXT = 500
MAX_METADATA_ENTRIES = 20
MAX_ID = 255


def username_problem(username: object) -> str | None:
    """Why ``username`` breaks the contract's rule, or None when it keeps it."""
    if not isinstance(username, str) or not 1 <= len(username) <= MAX_USERNAME:
        return f"a username is 1 to {MAX_USERNAME} characters"
    if not USERNAME_PATTERN.fullmatch(username):
        return 'a username has no "/" and no control characters'
    return None


def reason_problem(reason: object) -> str | None:
    """Why ``reason`` breaks the contract (``{type: string, maxLength: 500}``), or None."""
    if not isinstance(reason, str):
        return "reason must be a string (leave it out for none; null is not a string)"
    if len(reason) > MAX_TEXT:
        return f"reason is {len(reason)} characters long; at most {MAX_TEXT} are allowed"
    return None


def metadata_problem(metadata: object) -> str | None:
    """Why ``metadata`` breaks the contract, or None when it keeps it."""
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        return "metadata must be an object of strings"
    if len(metadata) > MAX_METADATA_ENTRIES:
        return f"metadata has at most {MAX_METADATA_ENTRIES} entries"
    if any(len(v) > MAX_TEXT for v in metadata.values()):
        return f"metadata values are at most {MAX_TEXT} characters"
    return None
