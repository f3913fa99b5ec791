"""Reservations: a JupyterHub group's GPUs (or MIG slices) for a window, once or weekly.

- :mod:`.rules`: the pure rules (reading a request, occurrences, validation, capacity);
- :mod:`.store`: the table ``gpuhub_reservations`` in the hub database;
- :mod:`.capacity`: how many GPUs the hub has, from its backend;
- :mod:`.handlers`: the REST endpoints and the admin page ``/hub/reservations``;
- :mod:`.hubconfig`: the custom scope and who holds it;
- :mod:`.cli`: ``gpuhub reservations list|create|edit|delete``.

This first part of issue 24 keeps reservations as checked records: nobody's GPU is held
for the group yet (the pool, the line and Slurm do not read them), no warning or stop
comes before a window, no course budget is charged.  The docs' "Reserve GPUs for a
course" says the same.
"""
