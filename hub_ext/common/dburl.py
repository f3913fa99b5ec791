"""Database URLs whose password is kept apart, in a variable of its own
(``GPUHUB_DB_PASSWORD``, ``GPUHUB_CREDITS_DB_PASSWORD``), so that the URL can be shown.

A leaf utility: the hub's configuration (:func:`hub_db_url`), ``gpuhub init`` and
``gpuhub upgrade`` (:mod:`hub_ext.ops.deploy`), ``gpuhub usage`` and the reference Credits
service (:mod:`hub_ext.credits.service`) use it; it imports nothing of the hub.
"""

from __future__ import annotations


def with_password(url: str, password: str, variable: str) -> str:
    """``url`` (SQLAlchemy) with ``password`` set; ``url`` unchanged when ``password`` is
    empty.  Raises ValueError naming ``variable`` when the URL carries a password too."""
    if not password:
        return url
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.password:
        raise ValueError(
            f"{variable} is set and the database URL has a password too; "
            "keep the password only in the variable"
        )
    return parsed.set(password=password).render_as_string(hide_password=False)


def hub_db_url(settings) -> str:
    """The hub database's SQLAlchemy URL, with ``GPUHUB_DB_PASSWORD`` filled in.

    The password is kept out of ``GPUHUB_DB_URL`` so that the URL can be shown; JupyterHub
    redacts it whenever it logs the URL.  Without ``GPUHUB_DB_URL``: SQLite in the state dir.
    """
    url = settings.db_url or f"sqlite:///{settings.state_dir / 'jupyterhub.sqlite'}"
    return with_password(url, settings.db_password, "GPUHUB_DB_PASSWORD")
