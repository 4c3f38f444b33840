"""Memory creep (issue 14): RSS stays flat under varied batch shapes once inference/memory.py fixed glibc's mmap
threshold. Each case runs in a fresh process, so the allocator starts clean."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, cli_env

# A model of DistilBERT-base width (one layer, random weights) on the smoke tokenizer, fed 60 micro-batches of
# 1-32 texts of 3-95 words through the engine's own tokenizer and forward pass, as the service runs them.
SCRIPT = """
import random, sys, psutil
from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification
from inference import engine, memory
from inference.loading import load_model
smoke, folder, bounded = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
tokenizer = AutoTokenizer.from_pretrained(smoke)
config = DistilBertConfig(vocab_size=len(tokenizer), n_layers=1, num_labels=4, pad_token_id=tokenizer.pad_token_id)
DistilBertForSequenceClassification(config).save_pretrained(folder)
tokenizer.save_pretrained(folder)
loaded = load_model(folder, device="cpu", dtype="fp32")
if bounded:
    assert memory.keep_large_blocks_off_the_heap()
words = [w for w in tokenizer.get_vocab() if w.isalpha()]
rng = random.Random(0)
levels = []
for step in range(1, 61):
    texts = [(" ".join(rng.choices(words, k=rng.randint(3, 95))), None) for _ in range(rng.randint(1, 32))]
    engine.forward(loaded, engine.encode(loaded, texts, truncate=True, left=False))
    if step in (15, 60):
        levels.append(psutil.Process().memory_info().rss / 2**20)
print(levels[0], levels[1])
"""


def rss_levels(smoke_dir, folder, bounded: bool) -> tuple[float, float]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(smoke_dir / "model"), str(folder), "1" if bounded else "0"],
        cwd=ROOT,
        env=cli_env(OMP_NUM_THREADS="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, last = map(float, result.stdout.split())
    return first, last


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mmap threshold is glibc's (Linux)")
def test_resident_memory_stays_flat_under_varied_batch_shapes(smoke_dir, tmp_path):
    before = rss_levels(smoke_dir, tmp_path / "a", bounded=False)
    after = rss_levels(smoke_dir, tmp_path / "b", bounded=True)
    print(
        f"RSS after 15 and 60 batches: {before[0]:.0f} -> {before[1]:.0f} MB as glibc left it, "
        f"{after[0]:.0f} -> {after[1]:.0f} MB with the threshold fixed"
    )
    # Without the fix the creep shows in this project's venv (528 -> 729 MB) but not in every environment (CI's
    # system Python: 531 -> 484 MB), so only the bound itself is asserted.
    assert after[1] <= 1.10 * after[0], after
