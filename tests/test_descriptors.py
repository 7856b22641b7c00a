"""The rule for running out of file descriptors at ``accept()`` that the exporter's HTTP server
and ``link serve`` share (``sparkdiag/descriptors.py``); what each does besides is tested with
it: ``tests/test_web_audit.py`` (one warning per episode) and ``tests/test_link_hostile.py``
(the server goes on under an open-files limit of 40)."""

from __future__ import annotations

import errno

import pytest

from sparkdiag.descriptors import ACCEPT_PAUSE, next_pause, out_of_fds
from sparkdiag.link import server as link_server
from sparkdiag.web import serving


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
def test_these_accept_errors_are_out_of_descriptors(code: int) -> None:
    assert out_of_fds(OSError(code, "accept"))


@pytest.mark.parametrize("code", [errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINVAL])
def test_these_are_not(code: int) -> None:
    assert not out_of_fds(OSError(code, "accept"))
    assert not out_of_fds(OSError("no errno"))


def test_the_pause_starts_at_5_ms_and_doubles_to_1_s() -> None:
    pauses = [next_pause(0.0)]
    while len(pauses) < 10:
        pauses.append(next_pause(pauses[-1]))
    assert pauses[:3] == pytest.approx([0.005, 0.01, 0.02])
    assert pauses[7] == pytest.approx(0.64) and pauses[8:] == [1.0, 1.0]
    assert ACCEPT_PAUSE == (0.005, 1.0)


def test_both_servers_take_the_one_rule() -> None:
    link, web = vars(link_server), vars(serving)  # the names each server's module uses
    for names in (link, web):
        assert names["out_of_fds"] is out_of_fds and names["next_pause"] is next_pause
