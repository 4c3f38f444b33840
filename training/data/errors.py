"""The one error of the data pipeline: bad input data, named by file (or dataset) and row."""

from __future__ import annotations

from contract.errors import UserError


class DataError(UserError, ValueError):
    """Bad input data; the message names the file (or dataset) and the row."""
