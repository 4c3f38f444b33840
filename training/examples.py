"""`agnews examples`: the files the docs' commands read, written into a folder (default: here), so every command of
README.md and docs/ runs as written before you have files of your own. Synthetic and seeded, the same every time:
mine.csv (500 short texts of three topics, `text,label`: the own-data recipe's), news.csv (60 texts of the smoke
preset's four topics, labelled 0-3 as ag_news) and unlabelled.csv (10 of them, `text` only). An existing file is kept
unless --overwrite.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path

MINE_ROWS, NEWS_ROWS, UNLABELLED_ROWS = 500, 60, 10
TOPICS = {  # three classes a few words apart; each row a fresh combination of who, what, when and where
    "sports": (
        ["The team", "The coach", "The striker", "Fans", "The goalkeeper"],
        ["won the final", "scored twice in the second half", "lost the championship match", "signed a new contract"],
    ),
    "business": (
        ["Shares", "The bank", "Investors", "The company", "Oil prices"],
        ["rose after strong earnings", "cut interest rates again", "reported record profits", "fell on weak sales"],
    ),
    "science": (
        ["Researchers", "The telescope", "Scientists", "The space agency", "Engineers"],
        ["discovered a distant planet", "launched a probe to Mars", "found water ice on the moon", "built a chip"],
    ),
}
WHEN = ("on Monday", "on Friday", "this week", "late on Tuesday")
WHERE = ("officials said", "reports said", "in London", "in Chicago")


def topic_rows(n: int, seed: int) -> list[dict[str, str]]:
    """n rows of the three topics in turn, shuffled."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = list(TOPICS)[i % len(TOPICS)]
        who, what = TOPICS[label]
        text = f"{rng.choice(who)} {rng.choice(what)} {rng.choice(WHEN)}, {rng.choice(WHERE)}."
        rows.append({"text": text, "label": label})
    rng.shuffle(rows)
    return rows


def news_rows(n: int, seed: int) -> list[dict[str, object]]:
    """n texts of the smoke preset's generator, labelled by class id as ag_news is (0 World ... 3 Sci/Tech)."""
    from training.smoke import make_split

    return [{"text": text, "label": label} for text, label in make_split(n, seed)]


def write(path: Path, rows: list[dict], columns: list[str], overwrite: bool) -> str:
    """The file written (or kept); what to say of it."""
    if path.exists() and not overwrite:
        return f"{path}: kept as it is (--overwrite replaces it)"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return f"{path}: {len(rows)} rows ({', '.join(columns)})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agnews examples", description=" ".join(__doc__.split()))
    parser.add_argument("--output_dir", type=Path, default=Path("."), help="where to write them (default: here)")
    parser.add_argument("--overwrite", action="store_true", help="replace files of these names")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    news = news_rows(NEWS_ROWS, seed=42)
    said = [
        write(args.output_dir / "mine.csv", topic_rows(MINE_ROWS, seed=1), ["text", "label"], args.overwrite),
        write(args.output_dir / "news.csv", news, ["text", "label"], args.overwrite),
        write(args.output_dir / "unlabelled.csv", news[:UNLABELLED_ROWS], ["text"], args.overwrite),
    ]
    sys.stdout.write("".join(f"{line}\n" for line in said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
