"""Does `agnews tune` beat the defaults where they fail? Multi-label data with rare labels, made from real AG News
text: each text's topic, plus tags its words carry (oil, Iraq, elections, ...: 1 to 6 % of the texts each), as
GoEmotions' rare emotions are. The pretrained MiniLM is trained once with the default settings and once per trial of
`agnews tune`; both are scored on the same held-out rows by macro-F1 (every label counts alike, so the rare ones do).

    python bench/tune_bench.py                 # about 15 minutes on 2 CPU cores
    python bench/tune_bench.py --n_trials 12

Not a CI test: it prints one markdown block for docs/benchmarks-log.md (the machine, the commit, both rows).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from train_bench import AG_NEWS, LABELS, prepare_model  # noqa: E402

TAGS = {  # tag: words that carry it (whole words, any case)
    "oil": ("oil", "crude", "opec"),
    "iraq": ("iraq", "iraqi", "baghdad"),
    "election": ("election", "elections", "vote", "voters", "ballot"),
    "china": ("china", "chinese", "beijing"),
    "olympics": ("olympic", "olympics", "athens"),
    "microsoft": ("microsoft", "windows"),
    "court": ("court", "judge", "lawsuit", "trial"),
}
FIXED = ["--max_length", "96", "--per_device_eval_batch_size", "64", "--metric_for_best_model", "macro_f1"]


def labelled(text: str, topic: int) -> list[str]:
    words = set(re.findall(r"[a-z]+", text.lower()))
    return [LABELS[topic], *(tag for tag, carriers in TAGS.items() if words & set(carriers))]


def write_splits(work: Path, seed: int, train: int, validation: int, heldout: int) -> dict[str, float]:
    """train/validation/heldout.jsonl (text, labels); each tag's share of the training texts."""
    with open(AG_NEWS, encoding="utf-8") as fh:
        rows = [(r["text"], int(r["label"])) for r in csv.DictReader(fh)]
    random.Random(seed).shuffle(rows)
    parts = {"train": rows[:train], "validation": rows[train : train + validation]}
    parts["heldout"] = rows[train + validation : train + validation + heldout]
    for name, part in parts.items():
        with open(work / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for text, topic in part:
                fh.write(json.dumps({"text": text, "label": labelled(text, topic)}) + "\n")
    tagged = [labelled(text, topic) for text, topic in parts["train"]]
    return {tag: sum(tag in labels for labels in tagged) / len(tagged) for tag in TAGS}


def rare_tag_data(work: Path, seed: int, train: int, validation: int) -> tuple[dict[str, float], list[str], str]:
    """(tags' shares, the training flags naming MiniLM and the three splits, the model's description)."""
    shares = write_splits(work, seed, train, validation, 1000)
    model, model_name = prepare_model("minilm", work)
    data = ["--model_name_or_path", str(model), "--train_file", str(work / "train.jsonl")]
    data += ["--validation_file", str(work / "validation.jsonl"), "--test_file", str(work / "heldout.jsonl")]
    return shares, data, model_name


def agnews(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "training.commands", *args], cwd=ROOT, capture_output=True, text=True
    )
    if result.returncode:
        sys.exit(f"agnews {args[0]} failed ({result.returncode}):\n{result.stderr[-4000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_trials", type=int, default=8)
    parser.add_argument("--train", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="tune_bench_") as tmp:
        work = Path(tmp)
        shares, data, model_name = rare_tag_data(work, args.seed, args.train, 500)
        started = time.perf_counter()
        agnews("train", *data, *FIXED, "--output_dir", str(work / "defaults"))
        default_s = time.perf_counter() - started
        started = time.perf_counter()
        agnews("tune", *data, *FIXED, "--n_trials", str(args.n_trials), "--output_dir", str(work / "tuned"))
        tune_s = time.perf_counter() - started
        defaults = json.loads((work / "defaults" / "metrics.json").read_text())
        searched = json.loads((work / "tuned" / "tune.json").read_text())
        best = json.loads((Path(searched["best"]["folder"]) / "metrics.json").read_text())
    states = [t["state"] for t in searched["trials"]]
    print(f"### Tuning against the defaults on rare labels (commit {commit.stdout.strip()})\n")
    print(f"Machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; {model_name}")
    print(f"data: {AG_NEWS.name}, {args.train} training / 500 validation / 1000 held-out texts (seed {args.seed});")
    print("tags' shares of the training texts: " + ", ".join(f"{t} {s:.1%}" for t, s in shares.items()))
    print(f"tune: {len(states)} trials ({states.count('complete')} complete, {states.count('pruned')} pruned)\n")
    print("| run | held-out macro-F1 | held-out micro-F1 | settings | wall s |")
    print("|---|---|---|---|---|")
    for name, metrics, settings, seconds in (
        ("defaults", defaults, "as given", default_s),
        ("tuned (best trial)", best, searched["best"]["params"], tune_s),
    ):
        test = metrics["test"]
        print(f"| {name} | {test['macro_f1']:.4f} | {test['micro_f1']:.4f} | {settings} | {seconds:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
