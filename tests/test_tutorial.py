"""docs/tutorial/first-hub.md followed from a fresh clone: each command finds what it needs
because an earlier one installed it (scripts/build-images.sh and the ``gpuhub`` command read
the ``.venv`` that ``scripts/setup.sh`` makes), and the server's own software is installed
by commands the page gives.  The commands themselves are run by the compose tier
(tests/compose/test_compose.py) as the how-to pages write them."""

from __future__ import annotations

import re

from tests.fixtures.hub import REPO

TUTORIAL = REPO / "docs" / "tutorial" / "first-hub.md"


def section(number: int) -> str:
    text = TUTORIAL.read_text()
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def commands(markdown: str) -> list[str]:
    """The lines of the ```bash blocks, comments and continuations joined."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_the_gpu_server_gets_docker_compose_and_the_nvidia_container_toolkit():
    installs = " ".join(c for c in commands(section(2)) if "apt-get install" in c)
    for package in ("docker.io", "docker-compose", "nvidia-container-toolkit"):
        assert re.search(rf"\b{re.escape(package)}\b", installs), package
    assert any("nvidia-ctk runtime configure --runtime=docker" in c for c in commands(section(2)))


def test_setup_comes_before_every_command_that_needs_what_it_installs():
    steps = commands(section(3))
    first = next(i for i, c in enumerate(steps) if c.startswith("scripts/setup.sh"))
    needs_setup = re.compile(
        r"scripts/build-images\.sh|^docker-compose |\.venv/bin/|"
        r"\bgpuhub (init|config|credits|upgrade|gpus|usage|reservations)\b"
    )
    for i, command in enumerate(steps):
        if needs_setup.search(command):
            assert i > first, f"{command!r} comes before scripts/setup.sh"
    # what it runs builds the images docker-compose.yml names (hub, postgres) too
    script = (REPO / "scripts" / "setup.sh").read_text()
    assert "set -- base pytorch hub postgres" in script
