"""The Docker backend: each server is a container on the hub's own Docker engine.

- :mod:`.spawner`: GPUDockerSpawner, DockerSpawner answering the spawn lifecycle
  (:class:`hub_ext.spawn.backend.SpawnBackend`; the story: docs/explanation/spawn.md);
- :mod:`.settings`: its settings (``c.GPUDockerSpawner.*``);
- :mod:`.container`: the member's uid and workspace, and the container built as a value;
- :mod:`.pool`: the node's GPUs handed out exclusively, from :mod:`.inventory` (NVML
  through :mod:`.nvml`, or a simulated node); :mod:`.reconcile`: its books checked against
  the containers Docker runs;
- :mod:`.line`: a start's GPUs at once or after a wait, and the pool granting freed GPUs to
  the head of the shared line; :mod:`.server_limits`: JupyterHub's two server limits,
  places in line not counted;
- :mod:`.availability`: free GPUs and image facts for the spawn page; :mod:`.board`: the
  GPU board;
- :mod:`.hubconfig`: the backend's own part of the hub's configuration
  (``GPUHUB_BACKEND=docker``).
"""
