"""UserError: the one base of every failure a user can fix, told in one line.

The commands and the service's start print it without a traceback and exit with `exit_code` (2 for usage, else 1).
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure the user can fix, said in one line."""

    exit_code = 1


class UsageError(UserError):
    """A wrong flag, config value or setting."""

    exit_code = 2


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be read or served."""
