"""Prometheus metrics of the GPU pool, the line, the credits hook, culling and GPU kernels.

They are registered in prometheus_client's default registry, which JupyterHub serves at
``/hub/metrics`` (JupyterHub docs, "Monitoring"), so no endpoint of our own is needed.
"""

from prometheus_client import Counter, Gauge, Histogram

GPUS = Gauge(
    "gpuhub_gpus",
    "Allocatable GPU units (whole GPUs with MIG off) by state: total, free, allocated, "
    "outside (compute processes of no hub server), unhealthy",
    ["state"],
)

ALLOCATIONS_REFUSED = Counter(
    "gpuhub_gpu_allocations_refused",
    "GPU allocations refused, by reason",
    ["reason"],
)

SPAWNS_REFUSED = Counter(
    "gpuhub_spawns_refused",
    "Spawns refused before a container was created, by reason",
    ["reason"],
)

CULLS = Counter(
    "gpuhub_culls",
    "Servers stopped by culling, by reason: idle (no activity; jupyterhub-idle-culler), "
    "idle_gpu (GPUs idle past the profile's gpu_idle_timeout), max_age",
    ["reason"],
)

LINE_LENGTH = Gauge(
    "gpuhub_line_length",
    "Places in the line of members waiting for a GPU, by profile",
    ["profile"],
)

LINE_WAIT = Histogram(
    "gpuhub_line_wait_seconds",
    "Seconds a member waited in line before their turn came (the server then starts), by profile",
    ["profile"],
    buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, float("inf")),
)

GPU_KERNELS = Gauge(
    "gpuhub_gpu_kernels",
    "GPU kernels (notebooks' kernels in containers of their own, hub_ext.kernels) by state: "
    "waiting (for their GPU), running; servers and notebook jobs are not counted",
    ["state"],
)

GPU_KERNELS_ENDED = Counter(
    "gpuhub_gpu_kernels_ended",
    "GPU kernels ended, by reason: shutdown (by their member), idle (the GPU kernels' idle "
    "time-out), idle_contended (idle past the shorter time-out while others waited for a GPU), "
    "parent_gone (their member's server stopped), died (their container ended), "
    "failed (could not start), left (shut down while waiting), stopped, ...",
    ["reason"],
)
