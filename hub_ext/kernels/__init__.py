"""GPU kernels: a notebook's kernel in a container of its own profile, holding a GPU only
while that kernel lives, while the member's server stays on the CPU profile.

- :mod:`.store`: the table ``gpuhub_kernels`` in the hub database;
- :mod:`.checks`: what a new kernel must pass (the body, the profile, the connection folder);
- :mod:`.lifecycle`: create, launch (a named server ``kernel-…`` started by the hub), stop,
  and the keeper (parent server gone, the idle time-out, ended containers, restarts);
- :mod:`.hook`: the spawner hook: forged kernel starts refused, a kernel ended exactly once,
  a server's kernels ended with it;
- :mod:`.handlers`: the REST endpoints (``/hub/api/gpuhub/kernels``), scope
  ``custom:gpuhub:kernels``;
- :mod:`.hubconfig`: the scope, the roles and server tokens that hold it, the hook.

In the member's server the provisioner ``gpuhub-provisioner`` (images/base,
``gpuhub_kernels``) asks for the kernel; in the kernel's container ``gpuhub-kernel`` runs
ipykernel on ipc sockets in her workspace.  The docs' explanation/gpu-kernels tells the
story; the endpoints are in reference/kernels-api.
"""
