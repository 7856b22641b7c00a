"""The machine and its operating system, read under the roots ``--path.sysfs`` and
``--path.rootfs`` so that a fake tree can stand in for it: PCIe links and devices (``sysfs.py``,
``udev.py``, the only importer of pyudev), memory and pressure (``meminfo.py``, ``pressure.py``),
processes and their cgroups (``procfs.py``, ``cgroup.py``, and their Python stacks through py-spy,
``pyspy.py``), where this process runs (``context.py``), the firmware's names (``dmi.py``), CPU
governors, the kernel log, mounts, block devices and NVMe drives, network interfaces and
GPUDirect RDMA.
"""
