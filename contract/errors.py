"""UserError: the base of every failure a user can fix, said in one line.

Commands and the service print it without traceback and exit with `exit_code` (2 usage, else 1). Other errors are bugs
and keep theirs.
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
