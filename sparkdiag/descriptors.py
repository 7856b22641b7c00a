"""Running out of file descriptors at ``accept()``: the rule both servers that accept
connections follow, the exporter's HTTP server (:mod:`sparkdiag.web.serving`) and ``link serve``
(:mod:`sparkdiag.link.server`, through :mod:`sparkdiag.link.bounds`).

* :func:`out_of_fds`: the errors that mean it (EMFILE, ENFILE, and ENOBUFS and ENOMEM, which
  Linux gives when it has no memory for one more socket). A client that is gone already
  (ECONNABORTED, EPROTO, EPERM) is not among them: the caller takes the next one at once.
* :func:`next_pause`: accepting pauses for 5 ms after the first such failure, twice as long
  after each failure in a row, at most 1 s, as Go's ``net/http`` ``Server.Serve`` does for a
  temporary ``Accept`` error; the caller starts again from 0 after an ``accept()`` that works.

What each server does besides differs, and stays with it: which connection it closes to make
room (the exporter's longest-idle connection, ``link serve``'s oldest unproved connection of the
address that holds the most), and how it says so (the exporter warns once per episode, an
episode ending after a minute without a failure, counted in its stats; ``link serve`` says a
line on its terminal at most every 10 s with a count of the lines left unsaid, as it does of
refused secrets).
"""

from __future__ import annotations

import errno

OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE = (0.005, 1.0)  # first and longest pause of accepting while out of descriptors


def out_of_fds(exc: OSError) -> bool:
    """Whether a failed ``accept()`` ran out of descriptors (or of memory for a socket)."""
    return exc.errno in OUT_OF_FDS


def next_pause(pause: float) -> float:
    """The pause of accepting after one more failure in a row, ``pause`` the one before it
    (0 after an ``accept()`` that worked): 5 ms, then doubled, at most 1 s."""
    return min(ACCEPT_PAUSE[1], max(ACCEPT_PAUSE[0], pause * 2))
