"""The Slurm backend: each server is a batch job on a Slurm cluster's nodes.

- :mod:`.spawner`: GPUSlurmSpawner, batchspawner's SlurmSpawner answering the spawn
  lifecycle (:class:`hub_ext.spawn.backend.SpawnBackend`; the story:
  docs/explanation/spawn.md);
- :mod:`.settings`: its settings (``c.GPUSlurmSpawner.*``);
- :mod:`.batch`: the member's workspace and the batch job built as a value;
- :mod:`.submit`: where the Slurm commands run (the hub's host or a submit host);
  :mod:`.cluster`: the cluster as the hub reads it (nodes, jobs, queue, how a job ended);
- :mod:`.line`: a pending job as a place in the hub's line; :mod:`.reservations` and
  :mod:`.enforce`: the hub's reservations as Slurm's own, enforced;
- :mod:`.availability`, :mod:`.board`, :mod:`.accounting`: free GPUs for the spawn page,
  the GPU board, ``gpuhub usage``'s Slurm accounting;
- :mod:`.config`: the backend's own part of the hub's configuration
  (``GPUHUB_BACKEND=slurm``); :mod:`.port_report`: batchspawner's port report, kept to
  the member's own server.
"""
