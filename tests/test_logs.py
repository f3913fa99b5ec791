"""The hub's log lines stay short, whatever a request carried."""

from __future__ import annotations

import io
import logging
import logging.config

from hub_ext.common.logs import logging_config


def hub_like_logger(name: str, most: int) -> tuple[logging.Logger, io.StringIO]:
    """A logger configured the way traitlets configures the hub's (dictConfig, a console
    handler), with ``logging_config`` merged in."""
    out = io.StringIO()
    config = {
        "version": 1,
        "handlers": {"console": {"class": "logging.StreamHandler", "stream": out}},
        "loggers": {name: {"level": "DEBUG", "handlers": ["console"]}},
        "disable_existing_loggers": False,
    }
    extra = logging_config(most=most)
    config["filters"] = extra["filters"]
    config["handlers"]["console"].update(extra["handlers"]["console"])
    logging.config.dictConfig(config)
    return logging.getLogger(name), out


def test_long_lines_and_tracebacks_are_cut():
    log, out = hub_like_logger("test-short-lines", most=200)
    log.info("Setting user_options on alice/big %s", {"profile": "B" * 100_000})
    try:
        raise ValueError("C" * 100_000)
    except ValueError:
        log.error("Failed", exc_info=True)
    log.info("a short line stays as it is")
    text = out.getvalue()
    assert len(text) < 1000, text[:1000]
    assert text.count("characters in all)") == 2  # the message and the traceback
    assert "a short line stays as it is\n" in text


def test_an_operators_logging_config_is_kept():
    mine = {
        "handlers": {"console": {"filters": ["mine"]}, "file": {"class": "x"}},
        "filters": {"mine": {"()": "logging.Filter"}},
    }
    merged = logging_config(mine)
    assert merged["handlers"]["console"]["filters"] == ["mine", "gpuhub_short_lines"]
    assert merged["handlers"]["file"] == {"class": "x"}
    assert set(merged["filters"]) == {"mine", "gpuhub_short_lines"}
