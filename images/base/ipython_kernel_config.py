# Every Python kernel of this image is gpuhub_kernel.GPUHubKernel: ipykernel's, with the
# debugger refused (images/README.md, "Kernels"). Read by ipykernel from $PREFIX/etc/ipython.
c.IPKernelApp.kernel_class = "gpuhub_kernel.GPUHubKernel"  # noqa: F821
