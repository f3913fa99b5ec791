"""``{gpuhub-settings}``: the settings reference, generated from the one declaration in
:mod:`hub_ext.settings.rows` (variable, type, default, what reads it, help, secret), so the
page cannot drift from what the hub parses.

One section per part of the hub that reads the settings (:data:`hub_ext.settings.BACKENDS`),
each a table.  :func:`settings_markdown` is the page's text (MyST); the directive parses it
in place, so
the page that holds it is a MyST Markdown page.
"""

from __future__ import annotations

from sphinx.util.docutils import SphinxDirective

from hub_ext.settings import BACKENDS, Flag, Setting, declared


def default_text(row: Setting) -> str:
    """The default column: the declared value, or what the reader derives (``default_doc``)."""
    if row.default_doc:
        return _text(row.default_doc)
    if isinstance(row.kind, Flag):
        return f"`{row.kind.on if row.default else row.kind.off}`"
    if row.default in ("", None):
        return "none"
    return f"`{row.default}`"


def _text(text: str) -> str:
    """Plain text for a Markdown table cell: nothing in it is markup."""
    for char in "\\|*_<>[]`{}":
        text = text.replace(char, "\\" + char)
    return text


def settings_markdown(rows: tuple[Setting, ...] | None = None) -> str:
    """The reference as MyST Markdown: a section (level 3) and a table per reader."""
    rows = declared() if rows is None else rows
    lines: list[str] = []
    for backend, title in BACKENDS.items():
        mine = [r for r in rows if r.backend == backend]
        if not mine:
            continue
        lines += [
            f"### {title}",
            "",
            "| variable | type | default | meaning |",
            "|---|---|---|---|",
        ]
        for r in mine:
            meaning = _text(r.help) + (
                " **Secret**: `gpuhub config show` masks it." if r.secret else ""
            )
            lines.append(f"| `{r.name}` | {_text(str(r.kind))} | {default_text(r)} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


class SettingsDirective(SphinxDirective):
    """Every declared setting, grouped by what reads it."""

    has_content = False

    def run(self):
        return self.parse_text_to_nodes(settings_markdown(), allow_section_headings=True)


def setup(app):
    app.add_directive("gpuhub-settings", SettingsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
