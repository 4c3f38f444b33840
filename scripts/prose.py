"""Prose density: words per docstring and per comment (consecutive `#` lines are one comment; a comment after code on
its line is one of its own), in the packages and, apart, in tests/ and bench/.

    python scripts/prose.py            # median words, share over 40 words, the longest ones

tests/test_code_shape.py keeps the bounds; the figures are comparable with the codebases docs/architecture.md names.
"""

from __future__ import annotations

import ast
import io
import statistics
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "training", "inference")
OUTSIDE = ("tests", "bench")  # held to the same bounds


def units(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment block of one file."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                found.append((getattr(node, "lineno", 1), doc))
    block, last = [], -2
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or token.string.startswith(("# noqa", "# type:", "# fmt:", "#!")):
            continue
        (line, column), text = token.start, token.string.lstrip("#").strip()
        if token.line[:column].strip():  # after code: a comment of its own
            found.append((line, text))
            continue
        if line != last + 1 and block:
            found.append((block[0][0], " ".join(text for _, text in block)))
            block = []
        block.append((line, text))
        last = line
    if block:
        found.append((block[0][0], " ".join(text for _, text in block)))
    return found


def measure(folders: tuple[str, ...] = PACKAGES) -> tuple[float, float, list[tuple[int, str]]]:
    """Median words, the share of units over 40 words, and every unit's (words, where)."""
    counted = []
    for package in folders:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in units(path):
                counted.append((len(text.split()), f"{path.relative_to(ROOT)}:{line}"))
    words = [n for n, _ in counted]
    return statistics.median(words), sum(n > 40 for n in words) / len(words), sorted(counted, reverse=True)


if __name__ == "__main__":
    for folders in (PACKAGES, OUTSIDE):
        median, over_40, counted = measure(folders)
        said = f"{', '.join(folders)}: {len(counted)} docstrings and comments: median {median} words"
        sys.stdout.write(f"{said}, {over_40:.1%} over 40 words\n")
        sys.stdout.writelines(f"  {n:4d}  {where}\n" for n, where in counted[:10])
