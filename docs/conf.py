"""Sphinx configuration of GPU Cluster Hub's documentation (MyST Markdown, pydata theme).

Build: ``scripts/docs.sh`` (``python -m sphinx -W --keep-going -n -b html docs docs/_build/html``);
``tests/test_docs.py`` runs the same build in CI.  Local extensions live in ``docs/_ext``.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # hub_ext, for the generated reference pages
sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "GPU Cluster Hub"
copyright = "GPU Cluster Hub contributors"
author = "GPU Cluster Hub contributors"

extensions = [
    "myst_parser",
    "sphinx_copybutton",
    "sphinxarg.ext",
    "gpuhub_metrics",
    "gpuhub_openapi",
    "gpuhub_settings",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_incoming", "screenshots", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "pydata_sphinx_theme"
html_title = "GPU Cluster Hub"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path = ["_static"]
html_css_files = ["gpuhub.css"]
html_show_sourcelink = False

# -n (nitpicky) is on in the build: every reference must resolve.
nitpicky = True
