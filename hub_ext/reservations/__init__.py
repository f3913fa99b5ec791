"""Reservations: a JupyterHub group's GPUs (or MIG slices) for a window, once or weekly.

- :mod:`.rules`: the pure rules (reading a request, occurrences, validation, capacity);
- :mod:`.store`: the table ``gpuhub_reservations`` in the hub database;
- :mod:`.capacity`: how many GPUs the hub has, from its backend;
- :mod:`.handlers`: the REST endpoints and the admin page ``/hub/reservations``;
- :mod:`.hubconfig`: the custom scope and who holds it;
- :mod:`.cli`: ``gpuhub reservations list|create|edit|delete``;
- :mod:`.backend`: what a backend that holds reservations itself (Slurm) answers the
  endpoints.

On Slurm each reservation is also Slurm's own (:mod:`hub_ext.slurm.reservations`), so
the cluster holds the GPUs for the group; the docs' "Reserve GPUs for a course" says what
the hub itself enforces.
"""
