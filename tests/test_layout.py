"""The package's layers, read from its imports (``ast``, every import in a module, those
inside functions included): one core, thin backends (docs: explanation/architecture).

- **Backends** (``hub_ext.docker``, ``hub_ext.slurm``) may import the core, never each other.
- **The core** (every other package) never imports a backend: it names one only by an
  import string chosen by configuration (``c.JupyterHub.spawner_class``,
  :mod:`hub_ext.backends`).
- **The core's packages are layers** (:data:`LAYERS`, lowest first): a package imports its
  own layer and those below, never one above, and packages of one layer do not import each
  other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "hub_ext"
BACKENDS = ("docker", "slurm")
#: The core, lowest first. ``hub_ext.<name>`` is a package or a top-level module.
LAYERS = (
    ("common",),  # the clock, tables, records, services, metrics
    ("settings", "backends"),  # the declaration; the backends by import string
    ("spawn",),  # the spawn core: choice, hooks, mounts, page, gate
    ("credits",),  # the Credits API client, hook, meter, service
    ("login", "line"),  # the authenticator; the line
    ("culling",),  # what stops servers and says why
    ("reservations",),  # windows for a group, enforced; who pays in one
    ("courses",),  # courses: instructors' roles, grants, budget
    ("jobs",),  # GPU notebook jobs: store, checks, lifecycle, hook, REST
    ("kernels",),  # GPU kernels: store, checks, lifecycle, hook, REST
    ("ops",),  # the board, usage, deployment, site additions
    ("config",),  # apply_config
    ("config_cli",),  # `gpuhub config show|check`
    ("cli",),  # `gpuhub`
)


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
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if node.module is None:  # from . import a, b: the modules a and b
                found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((target, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "hub_ext"]


def part(name: str) -> str | None:
    """The package or top-level module of ``hub_ext`` that ``name`` belongs to."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def layer(name: str | None) -> int | None:
    return next((i for i, names in enumerate(LAYERS) if name in names), None)


def layer_breaches(root: Path = ROOT) -> list[str]:
    """Each import under ``root`` that runs against the layers, as ``module:line -> import``;
    a package or top-level module in no layer is a breach too (name it in LAYERS)."""
    breaches = []
    for path in sorted(root.rglob("*.py")):
        name, _ = module_name(path, root)
        here = part(name)
        if here is None:
            continue
        if here not in BACKENDS and layer(here) is None:
            breaches.append(f"{name}: in no layer")
        for target, line in imports_of(path, root):
            there = part(target)
            where = f"{name}:{line} -> {target}"
            if there is None or there == here:
                continue
            if there in BACKENDS:
                breaches.append(where)  # the core, or the other backend, into a backend
            elif here not in BACKENDS and layer(there) >= layer(here):
                breaches.append(where)  # up a layer, or sideways within one
    return breaches


def test_no_import_runs_upward():
    assert layer_breaches() == []


def test_the_check_sees_each_kind_of_upward_import(tmp_path):
    """The check itself: a module written into a fake tree with each kind of breach."""
    fake = tmp_path / "hub_ext"
    for pkg in ("common", "credits", "login", "line", "docker", "slurm", "spawn"):
        (fake / pkg).mkdir(parents=True)
    (fake / "config.py").write_text("def f():\n    from .docker.pool import GPUPool\n")
    (fake / "credits" / "hook.py").write_text(
        "from ..common import metrics\nfrom ..config import with_password\n"
    )
    (fake / "slurm" / "spawner.py").write_text("import hub_ext.docker.pool\n")
    (fake / "docker" / "spawner.py").write_text("from ..spawn.core import SpawnerCore\n")
    (fake / "common" / "metrics.py").write_text("from ..spawn import core\n")
    (fake / "login" / "auth.py").write_text("from ..line import core\n")
    (fake / "stray.py").write_text("")
    assert layer_breaches(fake) == [
        "hub_ext.common.metrics:1 -> hub_ext.spawn",
        "hub_ext.config:2 -> hub_ext.docker.pool",
        "hub_ext.credits.hook:2 -> hub_ext.config",
        "hub_ext.login.auth:1 -> hub_ext.line",
        "hub_ext.slurm.spawner:1 -> hub_ext.docker.pool",
        "hub_ext.stray: in no layer",
    ]


@pytest.mark.parametrize("section", ["GPUDockerSpawner", "GPUSlurmSpawner"])
def test_no_shared_module_names_a_backends_spawner(section):
    """Shared settings go to the core's section (``c.SpawnerCore``, ``c.Spawner``), which
    both spawners read through traitlets' section inheritance; a backend's own go to its
    own config module."""
    named = [
        f"{module_name(p)[0]}:{i}"
        for p in sorted(ROOT.rglob("*.py"))
        if part(module_name(p)[0]) not in BACKENDS
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if section in line
    ]
    assert named == []


def missing_modules(root: Path = ROOT) -> list[str]:
    """Each ``hub_ext`` module an import under ``root`` names that the tree does not have,
    as ``module:line -> import``: a relative import left aimed at a module's old place
    after a move.  (``from . import a`` may name something ``__init__`` defines: only its
    package must exist.)"""

    def exists(name: str) -> bool:
        where = root.parent.joinpath(*name.split("."))
        return where.with_suffix(".py").exists() or (where / "__init__.py").exists()

    missing = []
    for path in sorted(root.rglob("*.py")):
        _, package = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names = [".".join([*base, *([node.module] if node.module else [])])]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "hub_ext" and not exists(name):
                    missing.append(f"{module_name(path, root)[0]}:{node.lineno} -> {name}")
    return missing


def test_every_import_names_a_module_that_exists():
    assert missing_modules() == []


def test_the_missing_module_check_sees_an_import_left_at_an_old_place(tmp_path):
    fake = tmp_path / "hub_ext"
    for package in (fake, fake / "ops", fake / "courses"):
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
    (fake / "ops" / "usage.py").write_text(
        "def f():\n    from .courses import load\n    from ..courses import load\n"
    )
    assert missing_modules(fake) == ["hub_ext.ops.usage:2 -> hub_ext.ops.courses"]
