"""GPU Cluster Hub's GPU kernels, the part in the images (docs: explanation/gpu-kernels).

In a member's server:

- :mod:`.specs`: :class:`~.specs.GPUHubKernelSpecManager` lists, beside "Python 3", one
  kernelspec per profile that offers GPU kernels (``GET /hub/api/gpuhub/kernels/specs``);
- :mod:`.provisioner`: :class:`~.provisioner.GPUHubProvisioner` (entry point
  ``gpuhub-provisioner`` of ``jupyter_client.kernel_provisioners``) asks the hub for the
  kernel with the server's own token, and follows it;
- :mod:`.transport`: how the server reaches the kernel's channels (on Docker: ipc
  sockets in a folder of the member's workspace);
- :mod:`.hub`: the hub's kernels API, one request helper.

In the kernel's container: :mod:`.kernel` (``gpuhub-kernel``) runs ipykernel on that
folder's connection file.
"""
