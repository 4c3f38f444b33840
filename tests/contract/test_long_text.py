"""contract/long_text.py: the tokenizer's own windows, pooling, one-line refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from contract.long_text import CHUNK, MAX, MEAN, TRUNCATE, LongText, LongTextError, TooManyWindows


@pytest.fixture(scope="module")
def tokenizer(smoke_dir):
    return AutoTokenizer.from_pretrained(smoke_dir / "model")


LONG = " ".join(f"officials said on monday, word{i} reuters reported." for i in range(12))


def content(tokenizer, ids: list[int]) -> list[int]:
    special = set(tokenizer.all_special_ids)
    return [i for i in ids if i not in special]


def test_windows_cover_the_text_with_the_stride_as_overlap(tokenizer):
    windows = LongText(CHUNK, stride=5).encode(tokenizer, [LONG, "a short one"], None, max_length=24)
    whole = content(tokenizer, tokenizer(LONG)["input_ids"])
    mine = [f["input_ids"] for f, owner in zip(windows.features, windows.owner) if owner == 0]
    assert windows.counts(2) == [len(mine), 1] and len(mine) > 3 and windows.owner == sorted(windows.owner)
    assert all(
        len(ids) <= 24 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id for ids in mine
    )
    pieces = [content(tokenizer, ids) for ids in mine]
    for before, after in zip(pieces, pieces[1:]):
        assert before[-5:] == after[:5]  # consecutive windows share `stride` tokens
    rebuilt = pieces[0] + [token for piece in pieces[1:] for token in piece[5:]]
    assert rebuilt == whole  # every token of the text is in a window, in order


def test_a_text_that_fits_is_its_truncation_exactly(tokenizer):
    texts = ["a short one", LONG]
    chunked = LongText(CHUNK, stride=5).encode(tokenizer, texts[:1], None, max_length=24)
    truncated = LongText(TRUNCATE).encode(tokenizer, texts, None, max_length=24)
    plain = tokenizer(texts, truncation=True, max_length=24)["input_ids"]
    assert [f["input_ids"] for f in truncated.features] == plain and truncated.owner == [0, 1]
    assert chunked.features == truncated.features[:1]


def test_a_pair_is_windowed_along_its_longer_text(tokenizer):
    windows = LongText(CHUNK, stride=4).encode(tokenizer, [LONG, "short"], ["short", LONG], max_length=32)
    short = tokenizer("short", add_special_tokens=False)["input_ids"]
    for feature, owner in zip(windows.features, windows.owner):
        ids = feature["input_ids"]
        first_sep = ids.index(tokenizer.sep_token_id)
        kept = ids[first_sep + 1 : -1] if owner == 0 else ids[1:first_sep]
        assert kept == short and len(ids) <= 32  # the short side whole in every window
    assert windows.counts(2)[0] == windows.counts(2)[1] > 2
    too_long = " ".join(["word"] * 40)
    with pytest.raises(LongTextError, match="shorter text of a pair takes"):
        LongText(CHUNK, stride=4).encode(tokenizer, [too_long + " more text"], [too_long], max_length=32)


def test_pooling_is_the_mean_or_the_maximum_of_a_texts_windows():
    logits = torch.tensor([[1.0, 0.0], [3.0, -2.0], [0.5, 0.5], [-1.0, 4.0]])
    owner = [0, 0, 1, 1]
    assert torch.equal(LongText(CHUNK, pooling=MEAN).pool(logits, owner, 2), torch.tensor([[2.0, -1.0], [-0.25, 2.25]]))
    assert torch.equal(LongText(CHUNK, pooling=MAX).pool(logits, owner, 2), torch.tensor([[3.0, 0.0], [0.5, 4.0]]))
    one_each = torch.randn(3, 4)
    assert LongText(CHUNK).pool(one_each, [0, 1, 2], 3) is one_each  # nothing to pool
    assert torch.equal(LongText(CHUNK).pool(torch.tensor([[2.0], [4.0]]), [1, 0], 2), torch.tensor([[4.0], [2.0]]))


def test_the_config_carries_the_contract():
    recorded = LongText(CHUNK, 16, MAX, 256)
    config = SimpleNamespace(**recorded.config_fields())
    assert LongText.of(config) == recorded
    assert LongText.of(SimpleNamespace()) == LongText()  # a model from elsewhere: truncate, defaults


def test_bad_settings_are_one_line(tokenizer):
    for bad, field in ((dict(mode="split"), "long_text"), (dict(pooling="median"), "chunk_pooling")):
        with pytest.raises(LongTextError, match=f"^{field}: must be one of"):
            LongText(**bad)
    with pytest.raises(LongTextError, match="^chunk_stride: must be a whole number"):
        LongText(CHUNK, stride=-1)
    with pytest.raises(LongTextError, match=r"^chunk_stride: must be smaller than a window's 22 text tokens .*got 22"):
        LongText(CHUNK, stride=22).encode(tokenizer, [LONG], None, max_length=24)
    LongText(TRUNCATE, stride=22).encode(tokenizer, [LONG], None, max_length=24)  # unused when truncating
    with pytest.raises(TooManyWindows, match="needs [0-9]+ windows of 24 tokens; at most 3 are allowed"):
        LongText(CHUNK, stride=5).encode(tokenizer, [LONG], None, max_length=24, max_windows=3)
