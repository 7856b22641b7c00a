"""The installed software, read from its files without importing or running it: which Python
environment the probe uses and its packages (``pyenv.py``, ``packages.py``), the shared libraries
with CUDA code in it (``cuda_libraries.py``) and their fat binaries (``fatbin.py``, through
``elf.py``), and NCCL's settings and libraries (``nccl.py``).
"""
