"""The settings reference page (docs/reference/settings.md) is generated from the
declaration by docs/_ext/gpuhub_settings.py: a Sphinx build of the page, as the docs site
builds it (MyST, warnings as errors), names every declared setting and follows a rename."""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import pytest
from sphinx.cmd.build import build_main

from hub_ext.settings import declared, setting
from hub_ext.settings import rows as settings_rows

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reference" / "settings.md"


def build_page(tmp_path: Path, monkeypatch) -> str:
    """The page's directive built alone with the extension, warnings as errors (HTML);
    returns its text, tags removed.  (The whole page, with its links to other pages, is
    built with the site: tests/test_docs.py.)"""
    monkeypatch.syspath_prepend(str(REPO / "docs" / "_ext"))
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "conf.py").write_text(
        'extensions = ["myst_parser", "gpuhub_settings"]\nnitpicky = True\n'
    )
    (src / "index.md").write_text("# Settings\n\n## Every setting\n\n```{gpuhub-settings}\n```\n")
    status = build_main(["-W", "-n", "-q", "-E", "-b", "html", str(src), str(out)])
    assert status == 0, "the page does not build cleanly"
    return html.unescape(re.sub(r"<[^>]+>", "", (out / "index.html").read_text()))


def test_the_page_holds_no_copy_of_the_table():
    text = PAGE.read_text()
    assert "```{gpuhub-settings}" in text
    assert "| `GPUHUB_" not in text


def test_the_reference_names_every_declared_setting(tmp_path, monkeypatch):
    text = build_page(tmp_path, monkeypatch)
    missing = [r.name for r in declared() if r.name not in text]
    assert missing == []
    for title in ("Core (both backends)", "Docker backend", "Slurm backend"):
        assert title in text
    assert re.search(r"GPUHUB_HUB_PORT\s+a whole number 1..65535\s+8081\s+the hub API", text)


def test_renaming_a_setting_renames_it_in_the_reference(tmp_path, monkeypatch):
    row = setting("GPUHUB_CULL_WARNING")
    monkeypatch.setattr(
        settings_rows,
        "ROWS",
        tuple(
            dataclasses.replace(r, name="GPUHUB_CULL_NOTICE") if r is row else r for r in declared()
        ),
    )
    text = build_page(tmp_path, monkeypatch)
    assert "GPUHUB_CULL_NOTICE" in text
    assert "GPUHUB_CULL_WARNING" not in text


@pytest.mark.parametrize("name", ["GPUHUB_OIDC_CLIENT_SECRET", "JUPYTERHUB_CRYPT_KEY"])
def test_the_reference_marks_secrets(tmp_path, monkeypatch, name):
    monkeypatch.syspath_prepend(str(REPO / "docs" / "_ext"))
    from gpuhub_settings import settings_markdown

    line = next(line for line in settings_markdown().splitlines() if f"`{name}`" in line)
    assert "**Secret**" in line
