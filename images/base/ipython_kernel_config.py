# Every Python kernel of this image is gpuhub_kernel.GPUHubKernel: ipykernel's, with the
# debugger refused, and its fork pipe on a private Unix socket, bounded and silent
# (images/README.md, "Kernels"). Read by ipykernel from $PREFIX/etc/ipython before the kernel
# opens its sockets.
import gpuhub_kernel

gpuhub_kernel.use_private_fork_pipe()
c.IPKernelApp.kernel_class = "gpuhub_kernel.GPUHubKernel"  # noqa: F821
