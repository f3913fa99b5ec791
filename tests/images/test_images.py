"""The single-user images (images/, built by scripts/build-images.sh) are what the hub expects.

jovyan with uid 1000 in group 100, a jupyterhub-singleuser that speaks the hub's API, bash and
git for the terminal, and labels that tell the truth about what is inside: the spawn page
shows them to students choosing a profile. The checks run real containers of the built images;
an image that is not built is skipped with the command that builds it.
"""

import asyncio
import json
import re
import secrets
from datetime import datetime

import httpx
import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.fixtures.kernels import (
    FACTS,
    LISTENING,
    debug_requests,
    facts_of,
    kernel_info,
    kernel_ports,
    run_code,
    start_kernel,
)

pytestmark = pytest.mark.docker

REQUIRED_LABELS = [
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.source",
    "org.opencontainers.image.version",
    "org.opencontainers.image.created",
    "io.gpuhub.python.version",
    "io.gpuhub.jupyterhub.version",
    "io.gpuhub.framework",
    "io.gpuhub.framework.version",
    "io.gpuhub.cuda.version",
]

FRAMEWORK_OF = {"base": "none", "pytorch": "pytorch", "tensorflow": "tensorflow"}

# Python printing, on two lines, the framework's version and the CUDA (major.minor or "none")
# that it was built for; for the base, "none" and the CUDA runtime of the image.
INSTALLED = {
    "none": (
        "import os; v = os.environ.get('CUDA_VERSION'); print('none'); "
        "print('.'.join(v.split('.')[:2]) if v else 'none')"
    ),
    "pytorch": (
        "import torch; v = torch.version.cuda; print(torch.__version__); "
        "print('.'.join(v.split('.')[:2]) if v else 'none')"
    ),
    "tensorflow": (
        "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'; import tensorflow as tf; "
        "v = tf.sysconfig.get_build_info().get('cuda_version'); print(tf.__version__); "
        "print('.'.join(v.split('.')[:2]) if v else 'none')"
    ),
}


def major_minor(version):
    return tuple(version.split(".")[:2])


# --- the user ------------------------------------------------------------------------------------


def test_runs_as_jovyan_uid_1000_gid_100(image):
    assert image.exec("id", "-u") == "1000"
    assert image.exec("id", "-un") == "jovyan"
    assert image.exec("id", "-g") == "100"


def test_starts_in_home_with_a_work_dir_jovyan_owns(image):
    assert image.exec("pwd") == "/home/jovyan"
    owner = image.exec("sh", "-c", "touch ~/work/probe && rm ~/work/probe && stat -c %u:%g ~/work")
    assert owner == "1000:100"


def test_jovyan_can_pip_install_into_the_environment(image):
    site = image.python("import sysconfig; print(sysconfig.get_paths()['purelib'])")
    assert site.startswith("/opt/venv/")
    image.exec("test", "-w", site)


# --- what the hub and the terminal need ----------------------------------------------------------


def test_singleuser_speaks_the_hubs_major_minor(image, hub_version):
    version = image.exec("jupyterhub-singleuser", "--version")
    assert major_minor(version) == major_minor(hub_version), (
        f"{image.name} has jupyterhub-singleuser {version}, the hub runs {hub_version}"
    )
    assert image.labels["io.gpuhub.jupyterhub.version"] == version


def test_bash_and_git_are_on_the_path(image):
    assert re.match(r"\d+\.\d+", image.exec("bash", "-c", "echo $BASH_VERSION"))
    assert image.exec("git", "--version").startswith("git version ")


# jovyan, and a member mapped to their own uid with no passwd entry (HOME as the spawner sets it)
MEMBERS = [
    pytest.param("", {}, id="jovyan"),
    pytest.param("4242:100", {"HOME": "/home/jovyan"}, id="own-uid"),
]
# JupyterLab's terminal is a login shell (terminado runs `bash -l`), which reads /etc/profile;
# `docker exec`, kernels and the server itself run with the image's environment.
SHELLS = [pytest.param("-lc", id="login"), pytest.param("-c", id="non-login")]
FRAMEWORK_MODULE = {"base": "jupyterhub.singleuser", "pytorch": "torch", "tensorflow": "tensorflow"}


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("user, env", MEMBERS)
def test_every_shell_has_the_venvs_python_pip_and_jupyter(image, user, env, shell):
    found = image.exec(
        "bash", shell, "command -v python pip jupyter python3", user=user, env=env
    ).splitlines()
    assert found == [f"/opt/venv/bin/{tool}" for tool in ("python", "pip", "jupyter", "python3")]
    module = FRAMEWORK_MODULE[image.short]
    origin = image.exec(
        "bash",
        shell,
        f"python -c 'import {module}; print({module}.__file__)'",
        user=user,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", **env},
    )
    assert origin.splitlines()[-1].startswith("/opt/venv/lib/")


@pytest.mark.parametrize("shell", SHELLS)
def test_every_shell_finds_nvidia_smi_where_the_nvidia_runtime_puts_it(image, shell):
    # the NVIDIA container runtime mounts nvidia-smi into /usr/bin; a stand-in takes its place
    image.exec(
        "sh",
        "-c",
        "printf '#!/bin/sh\\necho NVIDIA-SMI stand-in\\n' >/usr/bin/nvidia-smi"
        " && chmod 0755 /usr/bin/nvidia-smi",
        user="0",
    )
    try:
        assert image.exec("bash", shell, "nvidia-smi", user="4242:100") == "NVIDIA-SMI stand-in"
        assert image.exec("bash", shell, "command -v nvidia-smi") == "/usr/bin/nvidia-smi"
    finally:
        image.exec("rm", "-f", "/usr/bin/nvidia-smi", user="0")


def test_environment_suits_nvidia_runtime_and_terminals(image):
    env = dict(line.split("=", 1) for line in image.exec("env").splitlines() if "=" in line)
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env["SHELL"] == "/bin/bash"
    assert env["LANG"] == "C.UTF-8"
    assert env["PATH"].split(":")[0] == "/opt/venv/bin"


def test_jupyterlab_and_terminals_are_installed_and_enabled(image):
    assert re.fullmatch(r"4\.\d+\.\d+", image.exec("jupyter", "lab", "--version"))
    image.python("import jupyter_server_terminals, terminado")
    listing = image.exec("sh", "-c", "jupyter server extension list 2>&1")
    listing = re.sub(r"\x1b\[[0-9;]*m", "", listing)  # it colours "enabled" and "OK"
    for extension in ("jupyterlab", "jupyter_server_terminals"):
        assert re.search(rf"^\s*{extension} enabled$", listing, re.M), listing
        assert re.search(rf"^\s*{extension} \S+ OK$", listing, re.M), listing


# --- labels --------------------------------------------------------------------------------------


def test_has_every_label_the_spawn_page_reads(image):
    missing = [key for key in REQUIRED_LABELS if not image.labels.get(key)]
    assert not missing, f"{image.name} lacks labels {missing}"
    assert image.labels["org.opencontainers.image.title"] == f"gpuhub/{image.short}"
    datetime.fromisoformat(image.labels["org.opencontainers.image.created"].replace("Z", "+00:00"))


def test_python_label_is_the_interpreters_version(image):
    actual = image.python("import platform; print(platform.python_version())")
    assert image.labels["io.gpuhub.python.version"] == actual


def test_framework_label_names_the_images_framework(image):
    assert image.labels["io.gpuhub.framework"] == FRAMEWORK_OF[image.short]


def test_framework_and_cuda_labels_match_what_is_installed(image):
    framework = image.labels["io.gpuhub.framework"]
    version, cuda = image.python(INSTALLED[framework]).splitlines()[-2:]
    assert image.labels["io.gpuhub.framework.version"] == version
    assert image.labels["io.gpuhub.cuda.version"] == cuda


def test_base_has_no_framework(base_image):
    found = base_image.python(
        "import importlib.util as u; print([m for m in ('torch', 'tensorflow') if u.find_spec(m)])"
    )
    assert found == "[]"


def test_framework_image_keeps_the_base_packages_at_their_versions(framework_image, base_image):
    base_packages = set(base_image.exec("pip", "freeze", "--all").splitlines())
    packages = set(framework_image.exec("pip", "freeze", "--all").splitlines())
    assert base_packages <= packages, sorted(base_packages - packages)


# --- frameworks work -----------------------------------------------------------------------------


def test_framework_image_is_tagged_with_its_variant(framework_image, engine):
    cuda = framework_image.labels["io.gpuhub.cuda.version"]
    variant = "cpu" if cuda == "none" else "cuda"
    repository = framework_image.name.split(":")[0]
    tagged = engine.images.get(f"{repository}:{variant}")
    assert tagged.id == engine.images.get(framework_image.name).id


def test_torch_multiplies_matrices(pytorch_image):
    product = pytorch_image.python(
        "import torch; x = torch.arange(6.0).reshape(2, 3); print((x @ x.T).tolist())"
    )
    assert product == "[[5.0, 14.0], [14.0, 50.0]]"


def test_tensorflow_multiplies_matrices(tensorflow_image):
    product = tensorflow_image.python(
        "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'; import tensorflow as tf; "
        "x = tf.reshape(tf.range(6.0), (2, 3)); "
        "print(tf.matmul(x, x, transpose_b=True).numpy().tolist())"
    )
    assert product.splitlines()[-1] == "[[5.0, 14.0], [14.0, 50.0]]"


# --- the single-user server ----------------------------------------------------------------------


def test_singleuser_server_starts_and_asks_the_hub_its_version(alice_server, alice_hub):
    response = httpx.get(f"{alice_server.url}/api")
    assert response.status_code == 200, alice_server.logs()
    assert "version" in response.json()
    assert any(path.rstrip("/") == "/hub/api" for path in alice_hub.requests)


def test_singleuser_server_sends_strangers_to_the_hubs_login(alice_server):
    response = httpx.get(f"{alice_server.url}/lab")
    assert response.status_code == 302, alice_server.logs()
    assert response.headers["location"].startswith(
        "/hub/api/oauth2/authorize?client_id=jupyterhub-user-alice"
    )


def test_singleuser_server_accepts_alices_token_and_no_other(alice_server, alice_hub):
    alice = {"Authorization": f"token {alice_hub.ALICE_TOKEN}"}
    assert httpx.get(f"{alice_server.url}/api/status", headers=alice).status_code == 200
    stranger = {"Authorization": "token not-alices"}
    assert httpx.get(f"{alice_server.url}/api/status", headers=stranger).status_code == 403


async def test_terminal_opens_bash_as_jovyan(alice_server, alice_hub):
    alice = {"Authorization": f"token {alice_hub.ALICE_TOKEN}"}
    async with httpx.AsyncClient(headers=alice) as client:
        created = await client.post(f"{alice_server.url}/api/terminals")
    assert created.status_code == 200, alice_server.logs()
    name = created.json()["name"]
    ws_url = alice_server.url.replace("http://", "ws://") + f"/terminals/websocket/{name}"
    ws = await websocket_connect(HTTPRequest(ws_url, headers=alice))
    try:
        ws.write_message(json.dumps(["stdin", "echo shell=$0 user=$(id -un) bash=$BASH_VERSION\r"]))
        output = ""
        # The terminal echoes the typed line too; only the expanded answer matches.
        while not re.search(r"shell=\S*bash user=jovyan bash=\d", output):
            message = await asyncio.wait_for(ws.read_message(), timeout=20)
            assert message is not None, f"terminal closed; it said:\n{output}"
            kind, *content = json.loads(message)
            if kind == "stdout":
                output += content[0]
    finally:
        ws.close()


def test_every_image_keeps_kernels_on_unix_sockets(image):
    # /etc/jupyter/jupyter_server_config.json of the base, kept by the images FROM it
    shown = image.exec("sh", "-c", "jupyter server --show-config 2>/dev/null")
    assert "KernelManager\n  .transport = 'ipc'" in shown, shown


def test_every_image_serves_its_assets_compressed(image):
    # /etc/jupyter/jupyter_server_config.json of the base: JupyterLab's 6 MB of JavaScript
    # go gzipped to browsers that take it (tests/test_lab_assets_hub.py, through the proxy)
    shown = image.exec("sh", "-c", "jupyter server --show-config 2>/dev/null")
    assert "ServerApp" in shown and ".tornado_settings = {'compress_response': True}" in shown


async def test_kernels_run_on_unix_sockets_in_the_private_runtime_folder(alice_server, alice_hub):
    # images/base jupyter_server_config.json: no kernel port on a loopback that servers with
    # host networking (or on one Slurm node) share; notebooks still run (issue 21)
    alice = {"Authorization": f"token {alice_hub.ALICE_TOKEN}"}
    async with httpx.AsyncClient() as client:
        kernel = await start_kernel(client, alice_server.url, alice)
    ws_base = alice_server.url.replace("http://", "ws://")
    out = await run_code(ws_base, alice, kernel, FACTS + "print(6 * 7)")
    facts = facts_of(out)
    assert out.splitlines()[-1] == "42"
    runtime = "/home/jovyan/.local/share/jupyter/runtime"
    assert facts["info"]["transport"] == "ipc", facts
    assert facts["info"]["ip"] == f"{runtime}/kernel-{kernel}-ipc"
    assert kernel_ports(facts) == [], facts
    # the folder with the sockets: jovyan's alone (jupyter_core makes it 0700, sticky)
    code, out = alice_server.container.exec_run(
        ["stat", "-c", "%a %U %F", runtime, f"{runtime}/kernel-{kernel}-ipc-2"]
    )
    assert code == 0, out
    folder, sock = out.decode().splitlines()
    mode, owner, kind = folder.split(" ", 2)
    assert (int(mode, 8) & 0o077, owner, kind) == (0, "jovyan", "directory"), folder
    assert sock.endswith(" jovyan socket"), sock


def one_cell_notebook(source: str) -> str:
    """A notebook (JSON) of one code cell, for the image's python3 kernel."""
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "only",
        "metadata": {},
        "outputs": [],
        "source": source,
    }
    return json.dumps(
        {
            "cells": [cell],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


#: a notebook of one cell, FACTS (tests/fixtures/kernels.py): how its kernel is reached
FACTS_NOTEBOOK = one_cell_notebook(FACTS)

#: each tool a member may start a kernel with by hand, writing the executed notebook to out.ipynb
BY_HAND = {
    "nbconvert": "jupyter nbconvert --to notebook --execute --output out.ipynb in.ipynb",
    "jupyter-execute": "cp in.ipynb out.ipynb && jupyter execute --inplace out.ipynb",
    "papermill": "papermill --no-progress-bar in.ipynb out.ipynb",
}


@pytest.mark.parametrize("tool", list(BY_HAND))
def test_kernels_started_by_hand_use_unix_sockets_in_the_runtime_folder(image, tool):
    # images/base gpuhub_kernel_sockets.py, the python3 kernelspec's provisioner: no TCP port
    # for another process on the same network, whichever tool starts the kernel (issue 28)
    folder = f"/tmp/by-hand-{tool}"
    image.exec("mkdir", "-p", folder)
    image.container.put_archive(folder, _tar({"in.ipynb": FACTS_NOTEBOOK}))
    image.exec("sh", "-c", f"cd {folder} && {BY_HAND[tool]} >log 2>&1 || (cat log; exit 1)")
    notebook = json.loads(image.exec("cat", f"{folder}/out.ipynb"))
    text = "".join(
        "".join(o.get("text", "")) for cell in notebook["cells"] for o in cell.get("outputs", [])
    )
    facts = facts_of(text)
    runtime = "/home/jovyan/.local/share/jupyter/runtime/kernel-"
    assert facts["info"]["transport"] == "ipc", facts
    assert facts["info"]["ip"].startswith(runtime), facts
    assert facts["tcp_listening"] == [], facts  # the fork pipe is no TCP port either
    assert facts["fork_pipe_url"].startswith("ipc:///home/jovyan/.local/share/jupyter/runtime/")
    # nothing left beside the notebook (the ipc default would put socket files here)
    assert sorted(image.exec("ls", folder).split()) == ["in.ipynb", "log", "out.ipynb"]


def _tar(files: dict[str, str]) -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, 1000, 100
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


#: sends, as the kernel's own uid, two messages without the kernel's key to its fork pipe:
#: one with the marker, one of 64 MiB (issue 28: a 700 MiB one got a kernel OOM-killed)
STRANGER = r"""
import os, sys, time, zmq
url, marker = sys.argv[1], sys.argv[2].encode()
push = zmq.Context().socket(zmq.PUSH)
push.linger = 5000
push.connect(url)
push.send_multipart([os.urandom(16), marker])
push.send_multipart([os.urandom(16), marker + b"x" * (64 * 2**20)])
time.sleep(3)
push.close()
print("SENT")
"""

#: prints the kernel's resident memory, KiB
RSS_KIB = """
rss = next(ln for ln in open("/proc/self/status") if ln.startswith("VmRSS"))
print(int(rss.split()[1]))
"""


async def test_fork_pipe_is_private_bounded_and_silent(alice_server, alice_hub):
    # images/base gpuhub_kernel.py PrivateForkPipe: the pipe still brings a forked child's
    # output back; a message without the kernel's key is dropped unread and unechoed
    alice = {"Authorization": f"token {alice_hub.ALICE_TOKEN}"}
    async with httpx.AsyncClient() as client:
        kernel = await start_kernel(client, alice_server.url, alice)
    ws_base = alice_server.url.replace("http://", "ws://")
    facts = facts_of(await run_code(ws_base, alice, kernel, FACTS + "kept = 'still here'"))
    assert facts["fork_pipe_url"].startswith("ipc:///home/jovyan/.local/share/jupyter/runtime/")
    assert facts["fork_pipe_port"] is None and facts["tcp_listening"] == [], facts
    child = (
        "import os\npid = os.fork()\nif pid == 0:\n    print('from the child', flush=True)\n"
        "    os._exit(0)\nos.waitpid(pid, 0)\nimport time; time.sleep(0.5)"
    )
    assert "from the child" in await run_code(ws_base, alice, kernel, child)

    before = int(await run_code(ws_base, alice, kernel, RSS_KIB))
    marker = "stranger" + secrets.token_hex(4)
    code, out = alice_server.container.exec_run(
        ["python", "-c", STRANGER, facts["fork_pipe_url"], marker], user="1000:100"
    )
    assert code == 0 and b"SENT" in out, out
    after = int(await run_code(ws_base, alice, kernel, RSS_KIB))
    assert marker not in alice_server.container.logs().decode(errors="replace")
    assert after - before < 32 * 1024, (before, after)  # KiB: not 64 MiB taken in
    assert (await run_code(ws_base, alice, kernel, "print(kept)")).strip() == "still here"


#: a notebook job's notebook that prints a first line, 8 MiB, and a last line, and fails
LOUD_NOTEBOOK = one_cell_notebook(
    "import sys\n"
    "sys.stderr.write('FIRST LINE\\n' + 'x' * (8 * 2**20) + '\\nLAST LINE\\n')\n"
    "sys.stderr.flush()\n"
    "raise SystemExit('the end')"
)


def test_a_notebook_jobs_log_keeps_its_first_and_last_part_only(base_image):
    # images/base gpuhub-notebook-job BoundedLog: a job's output cannot fill the workspace's
    # disk (issue 28: 700 MiB in one log); the error at the end is still read
    folder = "/tmp/loud-job"
    base_image.exec("mkdir", "-p", f"{folder}/out")
    base_image.container.put_archive(folder, _tar({"loud.ipynb": LOUD_NOTEBOOK}))
    job = {
        "id": "loud",
        "input": "loud.ipynb",
        "cwd": "",
        "output_dir": "out",
        "outputs": {"ipynb": "out/loud.ipynb", "log": "out/loud.log"},
        "parameters": {},
    }
    env = {
        "GPUHUB_JOB": json.dumps(job),
        "GPUHUB_JOB_ROOT": folder,
        "GPUHUB_JOB_LINGER": "0",
        "GPUHUB_JOB_LOG_MAX_BYTES": str(2**20),
    }
    code, _ = base_image.container.exec_run(
        ["sh", "-c", "gpuhub-notebook-job --port=0 >/dev/null 2>&1"], environment=env
    )
    assert code == 1, code  # the notebook failed (SystemExit)
    size = int(base_image.exec("stat", "-c", "%s", f"{folder}/out/loud.log"))
    assert size < 2**20 + 200, size
    log = base_image.exec("sh", "-c", f"grep -a -v '^xxxx' {folder}/out/loud.log")
    assert "bytes of output left out here" in log, log[-2000:]
    assert "LAST LINE" in log and "gpuhub-error: " in log, log[-2000:]


def test_every_images_kernelspec_says_the_debugger_is_off(image):
    # images/base: JupyterLab shows no debugger toggle for this kernel (images/README.md "Kernels")
    spec = json.loads(
        image.exec(
            "python",
            "-c",
            (
                "import json, jupyter_client.kernelspec as k; "
                "print(json.dumps(k.get_kernel_spec('python3').metadata))"
            ),
        )
    )
    assert spec["debugger"] is False, spec


async def test_the_kernel_refuses_the_debugger_and_opens_no_port(alice_server, alice_hub):
    # images/base gpuhub_kernel.py: debugpy's adapter would listen on loopback TCP with no
    # token for every server sharing the network (security review of issue 21)
    alice = {"Authorization": f"token {alice_hub.ALICE_TOKEN}"}
    async with httpx.AsyncClient() as client:
        # what JupyterLab 4's debugger reads to offer its toggle (DebuggerService.isAvailable)
        specs = (await client.get(f"{alice_server.url}/api/kernelspecs", headers=alice)).json()
        assert specs["kernelspecs"]["python3"]["spec"]["metadata"]["debugger"] is False, specs
        kernel = await start_kernel(client, alice_server.url, alice)
    ws_base = alice_server.url.replace("http://", "ws://")
    before = json.loads(await run_code(ws_base, alice, kernel, LISTENING))
    info = await kernel_info(ws_base, alice, kernel)
    assert "debugger" not in info["supported_features"], info
    replies = await debug_requests(
        ws_base,
        alice,
        kernel,
        [("initialize", {"clientID": "jupyterlab", "adapterID": "python"}), ("attach", {})],
    )
    assert [r["success"] for r in replies] == [False, False], replies
    assert "debugger is off" in replies[0]["message"], replies
    assert json.loads(await run_code(ws_base, alice, kernel, LISTENING)) == before
    assert (await run_code(ws_base, alice, kernel, "print(6 * 7)")).strip() == "42"


# --- start-up: faster, and nothing the server does is lost (images/README.md "Start-up") -------

# Every server extension the image enables, with a request only that extension answers
# (None: it adds no handler of its own; its loading is what is checked).
SERVER_EXTENSIONS = {
    "jupyterlab": "/lab/api/settings/@jupyterlab/terminal-extension:plugin",
    "jupyter_server_terminals": "/api/terminals",
    "jupyter_lsp": "/lsp/status",
    "notebook_shim": None,
    "jupyter_scheduler": "/scheduler/config",  # notebook jobs (gpuhub_scheduler)
    "gpuhub_lab": "/gpuhub-lab/status",  # the status bar's GPUs and GPU kernels
    "jupyterhub": "/api/me",  # jupyterhub.singleuser's own extension
}


def test_image_enables_exactly_the_server_extensions_this_test_knows(base_image):
    listing = base_image.exec("sh", "-c", "jupyter server extension list 2>&1")
    listing = re.sub(r"\x1b\[[0-9;]*m", "", listing)
    enabled = set(re.findall(r"^\s+(\S+) enabled$", listing, re.M))
    assert enabled == set(SERVER_EXTENSIONS) - {"jupyterhub"}, listing


@pytest.mark.parametrize("extension", list(SERVER_EXTENSIONS))
def test_every_server_extension_loads_and_answers(alice_server, alice_hub, extension):
    logs = alice_server.logs()
    assert f"{extension} | extension was successfully loaded" in logs, logs
    path = SERVER_EXTENSIONS[extension]
    if path:
        alice = {"Authorization": f"token {alice_hub.ALICE_TOKEN}"}
        response = httpx.get(f"{alice_server.url}{path}", headers=alice)
        assert response.status_code == 200, (response.status_code, response.text[:500])


def test_hub_side_modules_the_image_defers_still_work(base_image):
    # gpuhub-lazy-imports defers jupyterhub's database imports; the hub's code still finds them
    out = base_image.python(
        "import jupyterhub.scopes as s, jupyterhub.utils as u, jupyterhub.log as l; "
        "import sys; print('jupyterhub.orm' in sys.modules); "
        "print(s.orm.User.__tablename__, s.roles.get_default_roles()[0]['name']); "
        "from jupyterhub.handlers.pages import HealthCheckHandler as H; "
        "h = H.__new__(H); print(l._is_health_check(h))"
    )
    assert out.splitlines() == ["False", "users user", "True"]


def test_aiohttp_makes_its_default_ssl_contexts_at_the_first_https_request(base_image):
    # gpuhub-lazy-imports: a server start (jupyterhub.singleuser imports aiohttp) no longer
    # loads the CA certificates; an HTTPS request without a context of its own still gets
    # aiohttp's verifying default (the system's CAs) or, with ssl=False, its unverified one
    out = base_image.python(
        "import ssl, jupyterhub.singleuser, aiohttp, aiohttp.connector as c; "
        "print(c._default_ssl_context.cache_info().currsize); "
        "from yarl import URL; "
        "conn = object.__new__(c.TCPConnector); conn._ssl = True; "
        "req = lambda s: aiohttp.ClientRequest('GET', URL('https://pypi.org/'), ssl=s); "
        "v, u = conn._get_ssl_context(req(True)), conn._get_ssl_context(req(False)); "
        "print(v.verify_mode == ssl.CERT_REQUIRED, v.check_hostname, "
        "v.cert_store_stats()['x509_ca'] > 0, u.verify_mode == ssl.CERT_NONE); "
        "print(v is c._SSL_CONTEXT_VERIFIED, u is c._SSL_CONTEXT_UNVERIFIED, "
        "c._default_ssl_context.cache_info().currsize)"
    )
    assert out.splitlines() == ["0", "True True True True", "True True 2"]


def test_extension_manager_makes_its_pypi_client_at_its_first_use(base_image):
    # gpuhub-lazy-imports: loading the lab extension (what a server start does) makes no httpx
    # client (httpcore, certifi's CA bundle); the Extension Manager's first PyPI request gets
    # the client httpx makes with JupyterLab's proxy arguments, and every later one the same
    out = base_image.python(
        "import sys, httpx; from jupyterlab.extensions.pypi import PyPIExtensionManager; "
        "m = PyPIExtensionManager(); print('httpcore' in sys.modules); "
        "first = m._httpx_client.get.__self__; "
        "print(type(first) is httpx.AsyncClient, 'httpcore' in sys.modules, "
        "m._httpx_client.get.__self__ is first)"
    )
    assert out.splitlines() == ["False", "True True True"]


def test_jsonschema_still_checks_the_formats_the_servers_events_use(base_image):
    # jupyter_events validates events with jsonschema's format checker; the image leaves out
    # only the IRI checker (rfc3987-syntax), which no event schema of the server uses
    out = base_image.python(
        "import jsonschema, pathlib, re, jupyter_server, jupyter_events; "
        "c = jsonschema.Draft7Validator.FORMAT_CHECKER; "
        "print(c.conforms('2020-01-01T00:00:00Z', 'date-time'), c.conforms('nope', 'date-time'), "
        "c.conforms('http://x/y', 'uri'), c.conforms('not a uri', 'uri')); "
        "used = set(); "
        "roots = [pathlib.Path(m.__file__).parent for m in (jupyter_server, jupyter_events)]; "
        "[used.update(re.findall(r'format: *\"?([a-z-]+)', p.read_text())) "
        " for r in roots for p in r.rglob('*.yaml')]; "
        "print(sorted(used & {'iri', 'iri-reference'}))"
    )
    assert out.splitlines() == ["True False True False", "[]"]
