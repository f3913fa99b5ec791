"""The JupyterLab extension committed in its prebuilt form (``images/base/gpuhub_lab/
labextension``, which the image build copies with no Node) is the build of its sources
(``images/lab-extension``): ``scripts/build-lab-extension.sh`` writes the sources'
fingerprint beside the build, and a change to the sources without a new build fails here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = REPO / "images" / "lab-extension"
BUILD = REPO / "images" / "base" / "gpuhub_lab" / "labextension"


def fingerprint(folder: Path) -> str:
    spec = importlib.util.spec_from_file_location("fingerprint", SOURCES / "fingerprint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fingerprint(folder)


def test_the_committed_build_is_built_from_the_sources_as_they_are():
    built_from = (BUILD / "sources.sha256").read_text().strip()
    assert built_from == fingerprint(SOURCES), (
        "images/lab-extension changed since its build: run scripts/build-lab-extension.sh "
        "and commit images/base/gpuhub_lab/labextension"
    )


def test_the_build_is_a_prebuilt_extension_of_the_sources_package(tmp_path):
    built = json.loads((BUILD / "package.json").read_text())
    source = json.loads((SOURCES / "package.json").read_text())
    assert (built["name"], built["version"]) == (source["name"], source["version"])
    assert (BUILD / built["jupyterlab"]["_build"]["load"]).is_file()


def test_a_change_to_the_sources_changes_the_fingerprint(tmp_path):
    copy = tmp_path / "lab-extension"
    for name in ("package.json", "package-lock.json", "tsconfig.json", "src", "style"):
        source = SOURCES / name
        target = copy / name
        if source.is_dir():
            for path in source.rglob("*"):
                if path.is_file():
                    (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                    (target / path.relative_to(source)).write_bytes(path.read_bytes())
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    assert fingerprint(copy) == fingerprint(SOURCES)
    (copy / "src" / "index.ts").write_text("// changed\n", "utf-8")
    assert fingerprint(copy) != fingerprint(SOURCES)
