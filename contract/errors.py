"""The one base of every failure a user can fix (a bad flag, setting, file, launch or checkpoint), told in one line.

The commands (training/cli.py: train, evaluate, predict, push) and the service's start (inference/__main__.py) report
one as a single line without a traceback and exit with its `exit_code`: 2 for a usage error (a bad flag, config or
setting, argparse's convention), 1 for the rest. Anything else is a bug and keeps its traceback. Each subclass keeps
a builtin base as well (ValueError for a bad value, RuntimeError for a state that cannot go on), so code that
catches those still does.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure the user can fix; the message says what and where, in one line."""

    exit_code = 1


class UsageError(UserError):
    """A flag, config value or setting that is wrong before any work starts."""

    exit_code = 2


class CheckpointError(UserError, RuntimeError):
    """A checkpoint folder that cannot be read or served; the message names the file or the model id."""
