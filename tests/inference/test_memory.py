"""RSS stays flat under varied batch shapes (BACKEND=torch, fresh process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.processes import ROOT, cli_env

# A base-wide model fed 60 varied micro-batches.
SCRIPT = """
import random, sys, psutil
from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification
from contract.model_call import forward
from inference.encoding import encode
from inference.prometheus import Metrics
from inference.engine.service import load_configured, ready_engine
from inference.settings import from_env
smoke, folder = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(smoke)
config = DistilBertConfig(vocab_size=len(tokenizer), n_layers=1, num_labels=4, pad_token_id=tokenizer.pad_token_id)
DistilBertForSequenceClassification(config).save_pretrained(folder)
tokenizer.save_pretrained(folder)
settings = from_env(model_id=folder, device="cpu", backend="torch", dtype="fp32", torch_threads=2)
loaded = ready_engine(settings, load_configured(settings), Metrics()).current
words = [w for w in tokenizer.get_vocab() if w.isalpha()]
rng = random.Random(0)
levels = []
for step in range(1, 61):
    texts = [(" ".join(rng.choices(words, k=rng.randint(3, 95))), None) for _ in range(rng.randint(1, 32))]
    forward(loaded, encode(loaded, texts, truncate=True, left=False))
    if step in (15, 60):
        levels.append(psutil.Process().memory_info().rss / 2**20)
print(levels[0], levels[1])
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mmap threshold is glibc's (Linux)")
def test_resident_memory_stays_flat_under_varied_batch_shapes(smoke_dir, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(smoke_dir / "model"), str(tmp_path / "wide")],
        cwd=ROOT,
        env=cli_env(OMP_NUM_THREADS="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, last = map(float, result.stdout.split())
    print(f"RSS after 15 and 60 batches: {first:.0f} -> {last:.0f} MB")
    assert last <= 1.10 * first, (first, last)
