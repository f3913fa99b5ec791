"""The fingerprint of the extension's sources, written beside its build
(``images/base/gpuhub_lab/labextension/sources.sha256``) by
``scripts/build-lab-extension.sh`` and compared by ``tests/test_lab_extension.py``: a
change to the sources without a new build fails that test.

    python3 images/lab-extension/fingerprint.py images/lab-extension
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

#: what the build is made from (node_modules comes from package-lock.json)
SOURCES = ("package.json", "package-lock.json", "tsconfig.json", "src", "style")


def fingerprint(folder: Path) -> str:
    """sha256 over each source file's path (relative, sorted) and bytes."""
    digest = hashlib.sha256()
    for name in SOURCES:
        top = folder / name
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.is_file():
                digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


if __name__ == "__main__":
    print(fingerprint(Path(sys.argv[1])))
