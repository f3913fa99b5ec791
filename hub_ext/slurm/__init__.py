"""The Slurm backend: the hub's servers run as Slurm batch jobs on a cluster's GPU nodes.

- :mod:`.spawner`: GPUSlurmSpawner, batchspawner's SlurmSpawner with the shared core
  (:mod:`hub_ext.spawn.core`);
- :mod:`.cluster`: what the hub reads from Slurm (nodes, free GPUs, jobs' GPUs, the queue);
- :mod:`.availability`: the spawn page's free GPUs per profile and image facts;
- :mod:`.board`: the GPU board's rows (nodes, their GPUs and jobs, pending jobs);
- :mod:`.spawner_line`: the spawner's part of the line (refusal when no GPU is free, the
  place of a pending job, a pending job taken back after a hub restart);
- :mod:`.spawner_end`: how a server's job ended (a notebook job's own end after its report,
  a node down, out of memory, cancelled outside the hub);
- :mod:`.line`: Slurm's queue as the shared line's backend (a pending job's standing).
- :mod:`.config`: the backend's own part of the hub's configuration
  (``GPUHUB_BACKEND=slurm``), and Slurm's accounting for ``gpuhub usage``.
"""
