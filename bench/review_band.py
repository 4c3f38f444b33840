"""Does a review band hold its precision on real text with rare labels? Multi-label data made from real AG News text
(tune_bench.py's: each text's topic plus tags its words carry, 1 to 6 % of the texts each, as GoEmotions' rare
emotions are). The pretrained MiniLM is trained once with `--review_precision P`; the held-out texts are labelled by
`agnews predict`. Per label and over all: the share of decisions kept (coverage) and the precision of the yes
decisions kept, against the fitted thresholds alone (every decision kept).

    python bench/review_band.py                      # about 5 minutes on 2 CPU cores
    python bench/review_band.py --precision 0.99

Not a CI test: it prints one markdown block for docs/benchmarks-log.md (the machine, the commit, the table).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from train_bench import AG_NEWS  # noqa: E402
from tune_bench import FIXED, agnews, rare_tag_data  # noqa: E402


def per_label(rows: list[dict], labels: list[str]) -> dict[str, dict]:
    """Each label's yes decisions: with the band (kept share of all its decisions, precision of the kept yes) and at
    the thresholds alone."""
    found = {}
    for label in labels:
        truth = [label in row["label"] for row in rows]
        plain = [label in row["predicted_labels"] for row in rows]
        kept = [label not in row["review"] for row in rows]
        banded_yes = [k and label in row["decision"] for k, row in zip(kept, rows)]
        found[label] = {
            "positives": sum(truth),
            "coverage": sum(kept) / len(rows),
            "yes_kept": sum(banded_yes),
            "precision": share([t for t, y in zip(truth, banded_yes) if y]),
            "yes_plain": sum(plain),
            "precision_plain": share([t for t, y in zip(truth, plain) if y]),
        }
    return found


def share(right: list[bool]) -> float | None:
    return sum(right) / len(right) if right else None


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", type=float, default=0.95)
    parser.add_argument("--train", type=int, default=3000)
    parser.add_argument("--validation", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="review_band_") as tmp:
        work = Path(tmp)
        shares, data, model_name = rare_tag_data(work, args.seed, args.train, args.validation)
        out = work / "banded"
        agnews("train", *data, *FIXED, "--review_precision", str(args.precision), "--output_dir", str(out))
        labelled = work / "labelled.jsonl"
        agnews("predict", "--checkpoint_dir", str(out), "--input_file", str(work / "heldout.jsonl"),
               "--output_file", str(labelled), "--mixed_precision", "fp32")  # fmt: skip
        band = json.loads((out / "metrics.json").read_text())["review_band"]
        labels = list(json.loads((out / "config.json").read_text())["id2label"].values())
        rows = [json.loads(line) for line in labelled.read_text().splitlines()]
    test = band["test"]
    print(f"### A review band at precision {args.precision} on rare labels (commit {commit.stdout.strip()})\n")
    print(f"Machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; {model_name}")
    tags = ", ".join(f"{t} {s:.1%}" for t, s in shares.items())
    print(f"data: {AG_NEWS.name}, {args.train} training / {args.validation} validation / 1000 held-out texts (seed "
          f"{args.seed}); tags' shares of the training texts: {tags}")  # fmt: skip
    print(f"\nheld-out, every label cell: coverage **{test['coverage']:.3f}** (texts with no label withheld "
          f"{test['texts_decided']:.3f}); precision of the yes decisions kept **{shown(test['precision'])}** "
          f"(thresholds alone {shown(test['without_band']['precision'])}), of the no decisions kept "
          f"{shown(test['negative_precision'])} ({shown(test['without_band']['negative_precision'])})\n")  # fmt: skip
    print("| label | held-out positives | coverage | yes kept | precision | yes at the thresholds | precision |")
    print("|---|---|---|---|---|---|---|")
    for label, found in per_label(rows, labels).items():
        print(f"| {label} | {found['positives']} | {found['coverage']:.3f} | {found['yes_kept']} | "
              f"{shown(found['precision'])} | {found['yes_plain']} | {shown(found['precision_plain'])} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
