"""The shell and Python blocks of README.md and docs/*.md, as a user copies them. A block the suite cannot run says why
above it: `<!-- not run in the suite: REASON -->`, `<!-- run by tests/...py -->` or `<!-- stops offline: WHAT IT SAYS
-->`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"(?:^<!-- (?P<mark>[^\n]*?) -->\n)?^```(?P<lang>bash|python)\n(?P<code>.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    where: str  # README.md:13
    lang: str
    code: str
    mark: str | None  # "not run in the suite: ..." / "run by tests/..." / "stops offline: ..." / None: run here

    def __str__(self) -> str:
        return self.where


def blocks() -> list[Block]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text[: match.start("lang")].count("\n") + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            found.append(Block(where, match.group("lang"), match.group("code"), match.group("mark")))
    return found


def block(where_prefix: str, containing: str) -> Block:
    """The one block of a file holding `containing` (for a test that runs it itself)."""
    matching = [b for b in blocks() if b.where.startswith(where_prefix) and containing in b.code]
    assert len(matching) == 1, f"{where_prefix}: {len(matching)} blocks hold {containing!r}"
    return matching[0]
