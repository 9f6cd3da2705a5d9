"""Errors that are the command line user's to fix: `rlgate` prints their message on one line and exits 2."""


class UsageError(Exception):
    """A command cannot do what it was asked (a missing file, a wrong flag value); the message says why."""
