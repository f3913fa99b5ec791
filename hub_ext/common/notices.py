"""Messages for a member on the hub's home page, about their servers.

Several parts of the hub tell a member something about one of their servers: the credits
hook ("your credits ran out, your server stops in 4 min"), the culler ("your server was
stopped after 45 min with an idle GPU").  They all post here, under a *topic* of their own,
and the home page (``share/gpuhub/templates/home.html``) shows every message of the member
who is logged in, through the template variable ``gpuhub_notices`` (:func:`home_notices`,
a ``c.JupyterHub.template_vars`` entry).

A message is kept per (user, server, topic): posting again replaces it, and the part that
posted it withdraws it when it no longer holds (credits added, server started again).
Messages live in the hub process; a hub restart forgets them.
"""

from __future__ import annotations

__all__ = ["HomeNotices", "home_notices", "notices"]


class HomeNotices:
    """The messages of every member, by user, server name and topic."""

    def __init__(self) -> None:
        self._by_user: dict[str, dict[tuple[str, str], str]] = {}

    def post(self, username: str, server_name: str, topic: str, text: str) -> None:
        """Show ``text`` to ``username`` about their server ``server_name`` (``""``: the
        default server), replacing an earlier message of the same ``topic``."""
        messages = self._by_user.setdefault(username, {})
        messages.pop((server_name, topic), None)  # a new message goes last
        messages[(server_name, topic)] = text

    def withdraw(self, username: str, server_name: str, topic: str | None = None) -> None:
        """Remove the message of ``topic`` (every topic when None) about that server."""
        messages = self._by_user.get(username, {})
        for key in [k for k in messages if k[0] == server_name and topic in (None, k[1])]:
            del messages[key]

    def get(self, username: str, server_name: str, topic: str) -> str | None:
        """The message of ``topic`` about that server, or None."""
        return self._by_user.get(username, {}).get((server_name, topic))

    def for_user(self, username: str) -> list[str]:
        """Every message for ``username``, oldest first."""
        return list(self._by_user.get(username, {}).values())


_NOTICES = HomeNotices()


def notices() -> HomeNotices:
    """The hub process's notices (one per process, like the pool)."""
    return _NOTICES


def home_notices(user) -> list[str]:
    """``c.JupyterHub.template_vars["gpuhub_notices"]``: the logged-in member's messages.

    JupyterHub calls template_vars callables with the current user (None when logged out;
    JupyterHub docs, ``JupyterHub.template_vars``).
    """
    if user is None:
        return []
    return notices().for_user(user.name)
