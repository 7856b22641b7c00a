"""Stand-in for a container runtime (docker, podman, ...) driven by the compare tests.

``fake_runtime.py missing-image [options] IMAGE python3 ...``: what ``docker run`` prints when
the image cannot be found, on stderr, and exit status 125 (docker's own error status).

``fake_runtime.py exec [record=FILE] [anything ...] -- CMD...``: append this process's argv
(JSON, one line) to FILE, then replace this process with CMD (standard input, the worker's
source, passes straight through). Arguments before ``--`` are recorded and otherwise ignored,
so a test can check that shell metacharacters in them arrive literally and run nothing.

The tests also copy this file to an executable named ``docker`` so that messages name the
runtime as users see it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    argv = sys.argv[1:]
    mode = argv[0] if argv else ""
    if mode == "missing-image":
        # the image is the word before the interpreter (python3 ...)
        found = [i for i, a in enumerate(argv) if Path(a).name.startswith("python")]
        image = argv[found[0] - 1] if found and found[0] > 1 else "IMAGE"
        sys.stderr.write(
            f"Unable to find image '{image}' locally\n"
            f"docker: Error response from daemon: manifest for {image} not found: "
            "manifest unknown: manifest unknown.\n"
            "See 'docker run --help'.\n"
        )
        return 125
    if mode == "exec":
        split = argv.index("--")
        for item in argv[1:split]:
            if item.startswith("record="):
                with open(item[len("record=") :], "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(sys.argv) + "\n")
        cmd = argv[split + 1 :]
        os.execvp(cmd[0], cmd)
    sys.stderr.write(f"fake_runtime: unknown mode {mode!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
