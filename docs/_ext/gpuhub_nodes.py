"""Docutils helpers the local extensions share: a table from rows of inline nodes."""

from __future__ import annotations

from docutils import nodes


def table(
    header: list[str], rows: list[list[nodes.Node | str]], widths: list[int] | None = None
) -> nodes.table:
    """A table with ``header`` and ``rows``; a cell is a node or plain text.  Without
    ``widths`` the browser sizes the columns (docutils' ``colwidths-auto``)."""
    out = nodes.table(classes=["gpuhub-table"] + ([] if widths else ["colwidths-auto"]))
    group = nodes.tgroup(cols=len(header))
    out += group
    group.extend(nodes.colspec(colwidth=w) for w in (widths or [1] * len(header)))
    head = nodes.thead()
    group += head
    head += row(header)
    body = nodes.tbody()
    group += body
    body.extend(row(cells) for cells in rows)
    return out


def row(cells: list[nodes.Node | str]) -> nodes.row:
    """One table row."""
    out = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        content = nodes.Text(cell) if isinstance(cell, str) else cell
        entry += (
            content if isinstance(content, nodes.paragraph) else nodes.paragraph("", "", content)
        )
        out += entry
    return out


def inline(*parts: nodes.Node | str) -> nodes.inline:
    """Text and nodes side by side in one cell."""
    out = nodes.inline()
    for part in parts:
        out += nodes.Text(part) if isinstance(part, str) else part
    return out
