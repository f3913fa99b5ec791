"""``{gpuhub-metrics}``: the Prometheus metrics reference, read from the metric objects of
:mod:`hub_ext.common.metrics` (name as exported, type, labels, help, histogram buckets), so the page
cannot drift from the code.

prometheus_client exports a Counter ``x`` as ``x_total``, a Histogram ``x`` as ``x_bucket``,
``x_sum`` and ``x_count``; the table names the series a query uses.
"""

from __future__ import annotations

import importlib

from docutils import nodes
from docutils.parsers.rst import Directive
from gpuhub_nodes import table
from prometheus_client import Counter, Gauge, Histogram

KINDS = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}


def metrics(module) -> list[dict]:
    """One dict per metric object in ``module``, in the module's order: series, type,
    labels, help, buckets (histograms)."""
    out = []
    for obj in vars(module).values():
        kind = next((k for cls, k in KINDS.items() if isinstance(obj, cls)), None)
        if kind is None:
            continue
        name = obj._name
        series = {
            "counter": [f"{name}_total"],
            "gauge": [name],
            "histogram": [f"{name}_bucket", f"{name}_sum", f"{name}_count"],
        }[kind]
        out.append(
            {
                "series": series,
                "type": kind,
                "labels": list(obj._labelnames),
                "help": obj._documentation,
                "buckets": list(obj._upper_bounds) if kind == "histogram" else [],
            }
        )
    return out


class MetricsDirective(Directive):
    """A table of every metric of the module named in the argument (``hub_ext.common.metrics``)."""

    required_arguments = 1
    has_content = False

    def run(self):
        rows = []
        for m in metrics(importlib.import_module(self.arguments[0])):
            text = m["help"]
            if m["buckets"]:
                bounds = ", ".join("+Inf" if b == float("inf") else f"{b:g}" for b in m["buckets"])
                text += f" (buckets: {bounds})"
            first, *more = m["series"]
            series = nodes.inline()
            series += nodes.literal(text=first)
            if more:  # a histogram's other series differ by their suffix only
                series += nodes.Text(
                    " (and "
                    + ", ".join(name.removeprefix(first.removesuffix("_bucket")) for name in more)
                    + ")"
                )
            rows.append([series, m["type"], ", ".join(m["labels"]) or "-", text])
        return [table(["series", "type", "labels", "meaning"], rows)]


def setup(app):
    app.add_directive("gpuhub-metrics", MetricsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
