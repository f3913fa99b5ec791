"""The Slurm backend: the hub's servers run as Slurm batch jobs on a cluster's GPU nodes.

- :mod:`.spawner`: GPUSlurmSpawner, batchspawner's SlurmSpawner with the shared core
  (:mod:`hub_ext.spawner_core`);
- :mod:`.cluster`: what the hub reads from Slurm (nodes, free GPUs, the queue);
- :mod:`.line`: a pending job's place in line.
"""
