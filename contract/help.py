"""One `--help` style for every command's parser.

Types in capitals, a default said once, the usage naming the command as called. argparse only, so help answers before
torch is imported.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_TYPES = {int: "INT", float: "FLOAT"}
_SHOWN_DEFAULT = re.compile(r"\s*\(default: [^()]*\)$")


def prog(module: str) -> str:
    """`agnews X` when called through agnews, else `python -m MODULE`."""
    if sys.argv and sys.argv[0].startswith("agnews "):  # set by training/commands.py
        return sys.argv[0]
    line = sys.orig_argv  # runpy replaced sys.argv[0]; orig_argv has the command
    called = next((i for i, arg in enumerate(line[:-1]) if Path(arg).name == "agnews"), None)
    return f"agnews {line[called + 1]}" if called is not None else f"python -m {module}"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return _TYPES.get(action.type, "STR")

    def _metavar_formatter(self, action: argparse.Action, default_metavar: str):
        format_ = super()._metavar_formatter(action, default_metavar)
        # pydantic-settings writes types in lower case
        return lambda size: tuple(m.upper() if m and not m.startswith(("{", "[")) else m for m in format_(size))

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = _SHOWN_DEFAULT.search(text)
        if shown:  # added by parser builders; dropped when empty or already said
            said_before = "default" in text[: shown.start()].lower()
            return text[: shown.start()] if said_before or shown.group().endswith("(default: None)") else text
        unset = action.default in (None, False, "", [], argparse.SUPPRESS)
        if "default" in text.lower() or not action.option_strings or unset:
            return text
        return f"{text} (default: %(default)s)"
