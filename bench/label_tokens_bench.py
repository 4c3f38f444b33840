"""An encoder against a decoder classifier read through its label tokens, on the same rows: accuracy and training
examples/s, offline on the CPU: the smoke preset's DistilBERT, the pretrained MiniLM-L6, and Qwen3 causal LMs of the
smoke width made here with random weights (so zero-shot knows nothing: this measures the path's cost and that it
learns, not what a pretrained LM's label tokens bring). The real comparison, MiniLM-L6 against Qwen3-0.6B read through
its label tokens, needs that LM's weights: not offline here, and past what a GPU lease carries (64 MiB).

    python bench/label_tokens_bench.py            # about a minute on 2 CPU cores

Not a CI test: it prints one markdown block for docs/benchmarks-log.md (the machine, the commit, the rows).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.train_bench import minilm_package  # noqa: E402
from tests.helpers.tiny_models import tiny_config  # noqa: E402
from training.smoke import ensure_smoke_assets  # noqa: E402

WORDS = {"World": "world", "Sports": "sports", "Business": "business", "Sci/Tech": "science"}
TEMPLATE = "topic of the story : {text} . answer :"
# short: every model reaches the test labels' noise ceiling (0.982) by 300 steps; at 40 the paths still differ
STEPS = ["--max_train_steps", "40", "--eval_steps", "20", "--checkpointing_steps", "none", "--learning_rate", "3e-3"]


def causal_lm(folder: Path, smoke: Path) -> Path:
    """A tiny Qwen3 causal LM (width 32, 2 layers) over the smoke vocabulary plus the label words; its tokenizer
    apart (beside a qwen3 config, transformers would rebuild Qwen's own byte-level tokenizer)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    vocab = AutoTokenizer.from_pretrained(smoke / "model").get_vocab()
    extra = [w for w in [*WORDS.values(), "topic", "story", "answer", "<|endoftext|>"] if w not in vocab]
    vocab = {**vocab, **{word: len(vocab) + i for i, word in enumerate(extra)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="[UNK]")
    config = tiny_config("qwen3", len(vocab), max_position_embeddings=512, tie_word_embeddings=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder / "tokenizer")
    return folder


def train(out: Path, *args: str) -> dict:
    command = [sys.executable, "-m", "training.commands", "train", "--preset", "smoke", "--output_dir", str(out)]
    result = subprocess.run([*command, *STEPS, *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"train failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())


def main() -> int:
    smoke = ensure_smoke_assets()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="label_tokens_bench_") as tmp:
        work = Path(tmp)
        lm = causal_lm(work / "lm", smoke)
        decoder = ["--model_name_or_path", str(lm), "--tokenizer_name", str(lm / "tokenizer"), "--from_scratch",
                   "false", "--template", TEMPLATE]  # fmt: skip
        labels = ",".join(f"{label}={word}" for label, word in WORDS.items())
        minilm = ["--model_name_or_path", str(minilm_package()), "--from_scratch", "false", "--template", TEMPLATE]
        rows = {
            "encoder: the smoke DistilBERT (random init), fresh head": train(work / "encoder"),
            # pretrained: at the decoders' 3e-3 it diverges; 1e-4 is its fine-tuning rate (bench/real_accuracy.py)
            "encoder: MiniLM-L6 (pretrained, its own tokenizer), fresh head, 1e-4": train(
                work / "minilm", *minilm, "--learning_rate", "1e-4"
            ),
            "decoder: tiny Qwen3, fresh head": train(work / "fresh", *decoder),
        }
        started = train(work / "tokens", *decoder, "--label_tokens", labels)
        rows["decoder: tiny Qwen3, head from its label tokens"] = started
    print(f"### An encoder against a label-token decoder classifier, tiny models (commit {commit.stdout.strip()})\n")
    print(f"Machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; smoke preset "
          f"rows (3000 train, 600 test), 40 steps of 16 at 3e-3, template {TEMPLATE!r}\n")  # fmt: skip
    print("| model | test accuracy | training examples/s |")
    print("|---|---|---|")
    for name, summary in rows.items():
        print(f"| {name} | {summary['test']['accuracy']:.4f} | {summary['throughput']['examples_per_second']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
