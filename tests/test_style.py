"""The tree is formatted by ``ruff format`` and passes ``ruff check`` (pyproject.toml's rules):
CI fails on a file written in another style or with a lint error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.hub import REPO

RUFF = Path(sys.executable).with_name("ruff")
TREES = ["hub_ext", "tests", "benchmarks", "docs/_ext", "jupyterhub_config.py"]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_tree_passes_ruff(command):
    done = subprocess.run(
        [str(RUFF), *command, *TREES], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
