"""The single-user server's own start-up, inside the image: ``jupyterhub-singleuser`` (what the
hub runs) against ``jupyter lab`` (what a plain ``docker run`` runs), and one image against
another, interleaved.

    .venv/bin/python benchmarks/server_startup.py [--runs 7] [--images gpuhub/base:latest ...]
                                                  [--commands singleuser lab]

Each measurement is one container (``docker run --rm --network host``) in which
:data:`INSIDE` starts the command and times it from the process's start until its HTTP API
answers (``/api`` under the server's prefix for jupyterhub-singleuser, ``/api/status`` for
``jupyter lab``), with the process's CPU seconds until then (``/proc/<pid>/stat``). For
jupyterhub-singleuser a stand-in of the hub's REST API answers in the same container (its
start asks the hub's version; its activity reports are accepted), so the figure is the
server's alone: no Docker, no hub, no proxy. Rounds rotate the order of the (image, command)
pairs, so that the machine's load weighs on all alike; prints each median.

``spawn_latency.py`` measures the whole spawn; this tells how much of it the server itself
takes, and what a change to an image saves (run with the image before and after it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

INSIDE = r"""
import json, os, socket, subprocess, sys, threading, time, urllib.error, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Hub(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"version": os.environ["HUB_VERSION"]}).encode()
        self.send_response(200)
        self.send_header("X-JupyterHub-Version", os.environ["HUB_VERSION"])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass

hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
threading.Thread(target=hub.serve_forever, daemon=True).start()
api = f"http://127.0.0.1:{hub.server_address[1]}/hub/api"
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = dict(os.environ)
if sys.argv[1] == "singleuser":
    prefix = "/user/bench/"
    env.update(JUPYTERHUB_API_TOKEN="bench", JUPYTERHUB_API_URL=api,
               JUPYTERHUB_CLIENT_ID="jupyterhub-user-bench", JUPYTERHUB_USER="bench",
               JUPYTERHUB_BASE_URL="/", JUPYTERHUB_SERVICE_PREFIX=prefix,
               JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{port}{prefix}",
               JUPYTERHUB_ACTIVITY_URL=f"{api}/users/bench/activity",
               JUPYTERHUB_OAUTH_CALLBACK_URL=f"{prefix}oauth_callback",
               JUPYTERHUB_OAUTH_SCOPES='["access:servers!server=bench/"]',
               JUPYTERHUB_OAUTH_ACCESS_SCOPES='["access:servers!server=bench/"]',
               JUPYTERHUB_DEFAULT_URL="/lab")
    cmd, url = ["jupyterhub-singleuser"], f"http://127.0.0.1:{port}{prefix}api"
else:
    cmd = ["jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--IdentityProvider.token=bench"]
    url = f"http://127.0.0.1:{port}/api/status"
tick = os.sysconf("SC_CLK_TCK")
t0 = time.monotonic()
proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while True:
    try:
        request = urllib.request.Request(url, headers={"Authorization": "token bench"})
        urllib.request.urlopen(request, timeout=5).read()
        break
    except urllib.error.HTTPError:
        break  # an answer all the same
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        if proc.poll() is not None or time.monotonic() - t0 > 120:
            sys.exit(f"{cmd[0]} did not answer")
        time.sleep(0.005)
wall = time.monotonic() - t0
fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / tick
proc.terminate()
proc.wait(10)
print(json.dumps({"wall": wall, "cpu": cpu}))
"""


def one_start(image: str, command: str, script: Path, hub_version: str) -> dict:
    """One container of ``image`` running :data:`INSIDE` for ``command`` (``singleuser`` or
    ``lab``); returns ``{"wall": seconds until it answered, "cpu": its CPU seconds}``.
    Raises ``CalledProcessError`` when the server never answered."""
    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "host",
            "-e",
            f"HUB_VERSION={hub_version}",
            "-v",
            f"{script}:/tmp/gpuhub-bench.py:ro",
            image,
            "python",
            "/tmp/gpuhub-bench.py",
            command,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(runs: int, images: list[str], commands: list[str]) -> None:
    import jupyterhub

    pairs = [(i, c) for i in images for c in commands]
    times: dict[tuple[str, str], list[dict]] = {p: [] for p in pairs}
    load = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "inside.py"
        script.write_text(INSIDE)
        script.chmod(0o644)
        Path(tmp).chmod(0o755)
        for pair in pairs:  # warm-up: the page cache, Docker's image layers
            one_start(*pair, script, jupyterhub.__version__)
        for r in range(runs):
            for pair in pairs[r % len(pairs) :] + pairs[: r % len(pairs)]:
                times[pair].append(one_start(*pair, script, jupyterhub.__version__))
    print(
        f"load average before {' '.join(load)}, after "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}; {runs} rounds"
    )
    for image, command in pairs:
        walls = [t["wall"] for t in times[image, command]]
        cpus = [t["cpu"] for t in times[image, command]]
        print(
            f"  {image:<28} {command:<10} until it answers: median "
            f"{statistics.median(walls):.3f} s (CPU {statistics.median(cpus):.2f} s)  runs "
            f"{[round(w, 3) for w in walls]}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--images", nargs="+", default=["gpuhub/base:latest"])
    parser.add_argument(
        "--commands", nargs="+", default=["singleuser", "lab"], choices=["singleuser", "lab"]
    )
    args = parser.parse_args()
    main(args.runs, args.images, args.commands)
