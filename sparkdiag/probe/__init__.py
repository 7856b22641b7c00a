"""GEMM and memory-bandwidth probes.

``worker.py`` is a self-contained script that imports torch and runs the
suite; ``runner.py`` starts it in a subprocess and classifies each cycle.
The daemon imports only the runner: torch never loads in the daemon process.
"""

from sparkdiag.probe.runner import ProbeCycle, ProbeResult, run_worker, worker_path, worker_source

__all__ = ["ProbeCycle", "ProbeResult", "run_worker", "worker_path", "worker_source"]
