"""Prometheus metrics of the GPU pool, the credits hook and culling.

They are registered in prometheus_client's default registry, which JupyterHub serves at
``/hub/metrics`` (JupyterHub docs, "Monitoring"), so no endpoint of our own is needed.
"""

from prometheus_client import Counter, Gauge

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
