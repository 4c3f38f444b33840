"""DataError: bad input data, named by file and row."""

from __future__ import annotations

from contract.errors import UserError


class DataError(UserError, ValueError):
    """Bad input data; names the file and row."""
