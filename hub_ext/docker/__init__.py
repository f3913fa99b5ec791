"""The Docker backend: each server is a container on the hub's own Docker engine.

- :mod:`.spawner`: GPUDockerSpawner, DockerSpawner with the shared core
  (:mod:`hub_ext.spawn.core`) and :mod:`.spawner_line` (a start's GPUs, at once or after
  a wait in line) and :mod:`.server_limits` (JupyterHub's two server limits, places in line
  not counted);
- :mod:`.container`: the member's container (workspace, datasets, uid, limits, labels);
- :mod:`.pool`: the node's GPUs handed out exclusively, from :mod:`.inventory` (NVML
  through :mod:`.nvml`, or a simulated node);
- :mod:`.reconcile`: the pool's books checked against the containers Docker runs;
- :mod:`.pool_line`: the pool grants freed GPUs to the head of the shared line.
- :mod:`.hubconfig`: the backend's own part of the hub's configuration
  (``GPUHUB_BACKEND=docker``).

The Slurm backend is :mod:`hub_ext.slurm`; what both share lives at ``hub_ext``'s top level.
"""
