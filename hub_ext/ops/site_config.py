"""Site additions: ``jupyterhub_config.d/*.py`` (or ``GPUHUB_CONFIG_DIR``), run after the
hub's own configuration in ``jupyterhub_config.py``, so no site edits a shipped file (the
escape hatch of the-littlest-jupyterhub).  Docs: how-to/site-config.

Each file runs, in sorted order, with the hub's own ``c`` in scope (as
``jupyterhub_config.py`` does), so it may read and change what the hub set::

    # jupyterhub_config.d/50-announcement.py
    c.JupyterHub.template_vars["announcement"] = "Maintenance on Friday 18:00"
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..settings import setting

log = logging.getLogger("JupyterHub")


def load_site_config(c, folder: Path | str) -> list[Path]:
    """Run every ``*.py`` in ``folder`` (sorted by name) with ``c`` in scope; returns their
    paths.  A missing default folder is no addition; a missing folder that the setting
    names raises ValueError.  An exception in a file propagates (the hub does not start)."""
    folder = Path(folder)
    if not folder.is_dir():
        if folder != setting("GPUHUB_CONFIG_DIR").default:
            raise ValueError(f"GPUHUB_CONFIG_DIR names {folder}, which is not a folder")
        return []
    paths = sorted(folder.glob("*.py"))
    for path in paths:
        code = compile(path.read_text(), str(path), "exec")
        exec(
            code,
            {
                "c": c,
                "get_config": lambda: c,
                "__file__": str(path),  # noqa: S102
                "__name__": f"gpuhub_site_config.{path.stem}",
            },
        )
        log.info("Loaded site configuration %s", path)
    return paths
