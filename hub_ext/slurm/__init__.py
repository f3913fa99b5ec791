"""The Slurm backend: the hub's servers run as Slurm batch jobs on a cluster's GPU nodes.

- :mod:`.spawner`: GPUSlurmSpawner, batchspawner's SlurmSpawner with the shared core
  (:mod:`hub_ext.spawner_core`);
- :mod:`.cluster`: what the hub reads from Slurm (nodes, free GPUs, jobs' GPUs, the queue);
- :mod:`.availability`: the spawn page's free GPUs per profile and image facts;
- :mod:`.board`: the GPU board's rows (nodes, their GPUs and jobs, pending jobs);
- :mod:`.line`: a pending job's place in line.
"""
