"""The errors that reach a user, and the one table of exit statuses every command uses.

Exit status of every ``sparkdiag`` command:

====  ===========  ==========================================================================
code  name         meaning
====  ===========  ==========================================================================
0     OK           done: every check passed, every figure measured and within its limits
1     ATTENTION    look at it: a warning, a degraded or slower result, a gap over the limit,
                   nothing measured because the GPU was busy
2     USAGE        a bad command line, configuration file, fixture or other input: nothing ran
                   (click's own usage errors exit 2 too; the systemd unit does not restart on 2)
3     FAILED       a check failed, or the work could not be done: the worker crashed or timed
                   out, a container side failed, a peer or Prometheus could not be reached
130   INTERRUPTED  stopped by Ctrl-C (SIGINT) or SIGTERM before it finished
====  ===========  ==========================================================================

A command ends by returning its :class:`Exit` (nothing is OK). Code below the command layer
raises a :class:`SparkdiagError` (or a subclass): it carries its exit status and, where one flag
is to blame, that flag. The command line translates both once, at the edge (:mod:`sparkdiag.cli`),
into the exit status (and for an error one line on standard error); no command translates errors
or exits itself; SIGINT and SIGTERM are the edge's too (:mod:`sparkdiag.lifecycle`: INTERRUPTED).
A command's own body raises them too (:class:`UsageError` for what was asked,
:class:`SparkdiagError` for what could not be done); only click's parse stage (a flag's
``callback`` or ``type``) raises ``click.BadParameter``, which click shows with the usage line
and also exits 2. An error that says which flag it is about in its own words leaves
``flag`` unset, so that the flag is not named twice.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    ATTENTION = 1
    USAGE = 2
    FAILED = 3
    INTERRUPTED = 130


class SparkdiagError(Exception):
    """An error said to the user in one line, with the exit status it ends the command with.

    ``flag`` names the option or setting to blame (``--nvml-fixture``), shown before the message
    as click shows a bad parameter. Subclasses set the class attributes; an instance may
    override both.
    """

    exit_code: int = Exit.FAILED
    flag: str | None = None

    def __init__(
        self, message: str, *, flag: str | None = None, exit_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if flag is not None:
            self.flag = flag
        if exit_code is not None:
            self.exit_code = exit_code

    def line(self) -> str:
        """The one line printed after ``Error: ``."""
        return f"Invalid value for {self.flag!r}: {self.message}" if self.flag else self.message


class UsageError(SparkdiagError):
    """Bad input: a flag, a configuration value, a file given on the command line."""

    exit_code = Exit.USAGE
