"""Reservations: a JupyterHub group's GPUs (or MIG slices) for a window, once or weekly.

- :mod:`.rules`: the pure rules (reading a request, occurrences, validation, capacity);
- :mod:`.store`: the table ``gpuhub_reservations`` in the hub database;
- :mod:`.capacity`: how many GPUs the hub has, from its backend;
- :mod:`.handlers`: the REST endpoints and the admin page ``/hub/reservations``;
- :mod:`.hubconfig`: the custom scope and who holds it;
- :mod:`.cli`: ``gpuhub reservations list|create|edit|delete``;
- :mod:`.policy`: the pure rules of enforcement (units closed to a member, whom a window
  stops, the sentences);
- :mod:`.enforce`: the hub's pass that warns and stops, and the closure the pool and the
  line consult (the Docker backend's part: :mod:`hub_ext.docker.pool_reservations`);
- :mod:`.backend`: what a backend that holds reservations itself (Slurm) answers the
  endpoints.

On the Docker backend the hub enforces them (:mod:`.enforce`); on Slurm each reservation
is also Slurm's own (:mod:`hub_ext.slurm.reservations`), so the cluster holds the GPUs for
the group, and the hub (:mod:`.enforce` reading :mod:`hub_ext.slurm.enforce`) stops the
non-members' servers Slurm leaves running on the reserved nodes.  The docs' "Reserve GPUs
for a course" tells the story.
"""
