"""The hub's log stays readable: no line longer than a few thousand characters.

JupyterHub logs some request bodies whole (the REST API's PATCH of a server logs its new
``user_options`` at INFO; a body that is not JSON is logged at DEBUG), so one request of
megabytes would be megabytes of log.  :class:`ShortLines` cuts every record the hub's
console handler writes to its first ``most`` characters, traceback included, and says how
long it was.  :func:`logging_config` is the ``c.JupyterHub.logging_config`` that installs
it (traitlets ``Application.logging_config``, merged into the default ``dictConfig``).
"""

from __future__ import annotations

import logging

__all__ = ["ShortLines", "logging_config"]


class ShortLines(logging.Filter):
    """Cut a record's message, and its traceback, to at most ``most`` characters each."""

    def __init__(self, most: int = 4000):
        super().__init__()
        self.most = most

    def _cut(self, text: str) -> str:
        return f"{text[: self.most]}… (cut: {len(text)} characters in all)"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > self.most:
            record.msg, record.args = self._cut(message), None
        if record.exc_info and not record.exc_text:
            # the formatter reuses exc_text (logging.Formatter.format)
            text = logging.Formatter().formatException(record.exc_info)
            if len(text) > self.most:
                record.exc_text = self._cut(text)
        return True


def logging_config(existing: dict | None = None, most: int = 4000) -> dict:
    """``existing`` (an operator's ``c.JupyterHub.logging_config``) with :class:`ShortLines`
    on the console handler of traitlets' default logging config."""
    config = dict(existing or {})
    config["filters"] = {
        **config.get("filters", {}),
        "gpuhub_short_lines": {"()": f"{__name__}.ShortLines", "most": most},
    }
    handlers = dict(config.get("handlers", {}))
    console = dict(handlers.get("console", {}))
    console["filters"] = [*console.get("filters", []), "gpuhub_short_lines"]
    handlers["console"] = console
    config["handlers"] = handlers
    return config
