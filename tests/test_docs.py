"""The documentation site builds with every warning an error (``scripts/docs.sh``, the README's
docs command), and a broken internal link really fails that build.

The build is Sphinx's own (``sphinx-build -W --keep-going -n``, MyST Markdown, the docs
extra of pyproject.toml); a failure shows Sphinx's warnings.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def docs_build(src: Path, out: Path) -> subprocess.CompletedProcess:
    """``scripts/docs.sh OUT SOURCE``: the docs command itself, into a tmp dir."""
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "docs.sh"), str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_docs_build_without_warnings(tmp_path):
    result = docs_build(DOCS, tmp_path / "html")
    assert result.returncode == 0, f"the docs build failed:\n{result.stderr}"
    html = tmp_path / "html"
    # the generated references carry the code's names, not a copy of them
    assert "gpuhub_line_wait_seconds_bucket" in (html / "reference/metrics.html").read_text()
    assert "debit_id" in (html / "reference/credits-api.html").read_text()
    assert "--docker-socket" in (html / "reference/cli.html").read_text()
    assert (html / "_images" / "02-spawn-page.png").exists()


def test_broken_internal_link_fails_the_build(tmp_path):
    """A copy of the docs with one link to a page that does not exist and one to a heading
    that does not exist: the build fails and names both."""
    repo = tmp_path / "repo"
    shutil.copytree(DOCS, repo / "docs", ignore=shutil.ignore_patterns("_build", "_incoming"))
    (repo / "hub_ext").symlink_to(REPO / "hub_ext")  # the reference pages read it
    page = repo / "docs" / "howto" / "culling.md"
    page.write_text(
        page.read_text() + "\n\nSee [the gone page](../howto/no-such-page.md) and "
        "[a gone heading](../explanation/line.md#no-such-heading).\n"
    )
    result = docs_build(repo / "docs", tmp_path / "html")
    assert result.returncode != 0, "a broken link did not fail the build"
    assert "no-such-page" in result.stderr, result.stderr
    assert "no-such-heading" in result.stderr, result.stderr


def test_docs_command_installs_what_it_lacks(tmp_path):
    """Right after ``scripts/demo.sh`` (a .venv without Sphinx) or on a fresh clone,
    ``scripts/docs.sh`` installs the docs extra (``scripts/setup.sh --for docs``) and builds,
    as the demo and test commands install theirs.  Real pip, from the package registry."""
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("_build", "_incoming", "__pycache__", "*.egg-info")
    for part in ("docs", "hub_ext", "scripts"):
        shutil.copytree(REPO / part, repo / part, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, repo / name)
    subprocess.run(["python3", "-m", "venv", str(repo / ".venv")], check=True, timeout=120)
    result = subprocess.run(
        ["bash", str(repo / "scripts" / "docs.sh")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"the docs command failed:\n{result.stderr[-3000:]}"
    assert (repo / "docs" / "_build" / "html" / "tutorial" / "first-hub.html").exists()
    assert (repo / ".venv" / ".installed-docs").exists()
