"""The package's layers, read from its imports (``ast``, every import in a module, those
inside functions included): one core, thin backends (docs: "One core, thin backends").

- **Backends** (``hub_ext.docker``, ``hub_ext.slurm``) may import the core, never each other.
- **The core** (everything else) never imports a backend: it names one only by an import
  string chosen by configuration (``c.JupyterHub.spawner_class``, :mod:`hub_ext.backends`).
- **The core's subpackages** (``hub_ext.credits``, ``hub_ext.line``) import no top-level
  module of ``hub_ext`` except the leaf utilities in :data:`UTILITIES`, which themselves
  import no other ``hub_ext`` module than those utilities.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "hub_ext"
BACKENDS = ("hub_ext.docker", "hub_ext.slurm")
SUBPACKAGES = ("hub_ext.credits", "hub_ext.line")
#: Top-level modules the core's subpackages may import: leaves of the import graph.
UTILITIES = {"hub_ext.common.metrics", "hub_ext.common.private_files", "hub_ext.common.dburl", "hub_ext.spawn.hooks",
             "hub_ext.common.notices", "hub_ext.common.periodic", "hub_ext.spawn.stopping", "hub_ext.common.services",
             "hub_ext.common.db", "hub_ext.common.runs", "hub_ext.common.server_key", "hub_ext.settings",
             "hub_ext.settings.rows", "hub_ext.common.limits"}


def module_name(path: Path, root: Path = ROOT) -> tuple[str, str]:
    """(the module's dotted name, the package its relative imports start from)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        name = ".".join(parts[:-1])
        return name, name
    name = ".".join(parts)
    return name, name.rpartition(".")[0]


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """Every ``hub_ext`` module ``path`` imports, resolved, with its line: ``from . import
    x`` gives ``hub_ext.x`` (the module imported, not the package)."""
    _, package = module_name(path, root)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if node.module is None:  # from . import a, b: the modules a and b
                found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((target, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "hub_ext"]


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def top_level(name: str, root: Path = ROOT) -> str | None:
    """``hub_ext.x`` for a module of the package's top level (not a subpackage)."""
    parts = name.split(".")
    if len(parts) < 2 or (root / parts[1]).is_dir():
        return None
    return ".".join(parts[:2])


def layer_breaches(root: Path = ROOT) -> list[str]:
    """Each import under ``root`` that runs against the layers above, as
    ``module:line -> import``."""
    breaches = []
    for path in sorted(root.rglob("*.py")):
        name, _ = module_name(path, root)
        backend = next((b for b in BACKENDS if within(name, b)), None)
        subpackage = next((p for p in SUBPACKAGES if within(name, p)), None)
        for target, line in imports_of(path, root):
            upper = top_level(target, root)
            into = next((b for b in BACKENDS if within(target, b)), None)
            where = f"{name}:{line} -> {target}"
            if into is not None and into != backend:
                breaches.append(where)  # the core, or the other backend, into a backend
            elif subpackage and upper and upper not in UTILITIES:
                breaches.append(where)  # a subpackage up into its parent's top level
            elif name in UTILITIES and upper and upper not in UTILITIES:
                breaches.append(where)  # a utility that is no leaf
    return breaches


def test_no_import_runs_upward():
    assert layer_breaches() == []


def test_the_check_sees_each_kind_of_upward_import(tmp_path):
    """The check itself: a module written into a fake tree with each kind of breach."""
    fake = tmp_path / "hub_ext"
    (fake / "credits").mkdir(parents=True)
    (fake / "docker").mkdir()
    (fake / "slurm").mkdir()
    (fake / "config.py").write_text("def f():\n    from .docker.pool import GPUPool\n")
    (fake / "credits" / "hook.py").write_text(
        "from .. import metrics\nfrom ..config import with_password\n")
    (fake / "slurm" / "spawner.py").write_text("import hub_ext.docker.pool\n")
    (fake / "docker" / "spawner.py").write_text("from ..spawner_core import SpawnerCore\n")
    (fake / "metrics.py").write_text("from .config import REPO\n")
    assert layer_breaches(fake) == [
        "hub_ext.config:2 -> hub_ext.docker.pool",
        "hub_ext.credits.hook:2 -> hub_ext.config",
        "hub_ext.common.metrics:1 -> hub_ext.config",
        "hub_ext.slurm.spawner:1 -> hub_ext.docker.pool",
    ]


@pytest.mark.parametrize("section", ["GPUDockerSpawner", "GPUSlurmSpawner"])
def test_no_shared_module_names_a_backends_spawner(section):
    """Shared settings go to the core's section (``c.SpawnerCore``, ``c.Spawner``), which
    both spawners read through traitlets' section inheritance; a backend's own go to its
    own config module."""
    named = [f"{module_name(p)[0]}:{i}" for p in sorted(ROOT.rglob("*.py"))
             if not any(within(module_name(p)[0], b) for b in BACKENDS)
             for i, line in enumerate(p.read_text().splitlines(), 1) if section in line]
    assert named == []
