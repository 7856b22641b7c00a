#!/usr/bin/env python3
"""``sparkdiag watch`` with a small tick bound, for checking the merging of ticks on a real job.

    python3 scripts/device/watch_compact.py bounded [watch arguments] -- JOB
    python3 scripts/device/watch_compact.py plain [watch arguments] -- JOB

``bounded`` runs the command as it is but with at most ``MAX_TICKS`` ticks (default 32, from the
environment) and the Python stacks cut into the ticks every 8 ticks, so that a job of a minute
at 0.5 s has its ticks merged in pairs twice and its stretches folded several times on the way
(a real watch does so at 16,384 and every 1,024). ``plain`` is the command unchanged.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sparkdiag.commands.watch as command
from sparkdiag.cli import main
from sparkdiag.watch import job

if sys.argv[1] == "bounded":
    follow = command.follow
    bound = int(os.environ.get("MAX_TICKS", "32"))
    command.follow = lambda *a, **k: follow(*a, max_ticks=bound, **k)  # type: ignore[assignment]
    job.FOLD_TICKS = 8
sys.argv = ["sparkdiag", "watch", *sys.argv[2:]]
main()
