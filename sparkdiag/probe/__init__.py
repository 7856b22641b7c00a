"""The GEMM and memory-bandwidth probe worker, and how it runs.

``worker/`` is a package of rooms run as one self-contained script (``script.py`` assembles it:
standard library at module level, torch inside its functions, the only importer of torch) that runs
the suite or a soak and prints one JSON document; ``worker/contract.py`` is what both sides share
(schema, flags, dtypes, suites); ``document.py`` parses that document into frozen dataclasses;
``request.py`` builds its command line. It runs natively (``runner.py``: its own process group,
killed at the timeout), in a container (``container.py`` with ``relay.py``; ``diagnosis.py`` says
why a run could not be used), or replayed from a recording: ``launchers.py`` holds the three.
The daemon imports only these runners: torch never loads in the daemon process.

This package imports nothing itself, so that a module that needs one part (the contract, which
many modules read) does not load the others: re-exporting the runner made an import of
``worker/contract.py`` take 91 ms here instead of 31 ms.
"""
