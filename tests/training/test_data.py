"""Data loading, validation errors, the seeded validation split, tokenization and padding."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import write_rows
from training.config import load_config
from training.data import AG_NEWS_LABELS, DataError, load_splits, make_dataloaders, tokenize_splits
from training.model import load_tokenizer

NAMES = AG_NEWS_LABELS
TEXTS = ["Stocks rallied on Wall Street", "The Yankees beat the Red Sox", "NASA launched a probe to Mars",
         "Leaders signed a ceasefire", "Oil prices fell again", "Federer won at Wimbledon"]


def rows(n: int = 40, by_name: bool = False) -> list[dict]:
    return [{"text": f"{TEXTS[i % len(TEXTS)]} number {i}", "label": NAMES[i % 4] if by_name else i % 4}
            for i in range(n)]


def config(train, *extra):
    return load_config(["--train_file", str(train), "--validation_split", "0.25", *extra])


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_local_files_with_ids_or_names_give_the_same_labels(tmp_path, suffix):
    by_id = write_rows(tmp_path / f"ids{suffix}", rows())
    by_name = write_rows(tmp_path / f"names{suffix}", rows(by_name=True))
    a, b = load_splits(config(by_id)), load_splits(config(by_name))
    assert a.label_names == b.label_names == NAMES
    assert list(a.train["labels"]) == list(b.train["labels"])
    assert list(a.train["text"]) == list(b.train["text"])
    expected = {r["text"]: r["label"] for r in rows()}
    assert all(expected[t] == y for t, y in zip(a.validation["text"], a.validation["labels"]))


def test_custom_class_names_are_sorted_or_taken_from_config(tmp_path):
    data = [{"text": f"text {i}", "label": ["pos", "neg", "neutral"][i % 3]} for i in range(30)]
    train = write_rows(tmp_path / "t.csv", data)
    assert load_splits(config(train)).label_names == ["neg", "neutral", "pos"]
    splits = load_splits(config(train, "--label_names", "pos", "neg", "neutral"))
    assert splits.label_names == ["pos", "neg", "neutral"]
    expected = {r["text"]: r["label"] for r in data}
    assert all(splits.label_names[y] == expected[t] for t, y in zip(splits.train["text"], splits.train["labels"]))


def test_validation_split_is_seeded_deterministic_and_disjoint(tmp_path):
    train = write_rows(tmp_path / "t.csv", rows(200))
    first, again = load_splits(config(train)), load_splits(config(train))
    other_seed = load_splits(config(train, "--seed", "7"))
    assert list(first.validation["text"]) == list(again.validation["text"])
    assert list(first.validation["text"]) != list(other_seed.validation["text"])
    assert len(first.validation) == 50 and len(first.train) == 150
    assert not set(first.validation["text"]) & set(first.train["text"])


def test_validation_and_test_files_and_num_samples(tmp_path):
    train = write_rows(tmp_path / "t.csv", rows(100))
    val = write_rows(tmp_path / "v.jsonl", rows(12, by_name=True))
    test = write_rows(tmp_path / "x.parquet", rows(20))
    splits = load_splits(config(train, "--validation_file", str(val), "--test_file", str(test), "--num_samples", "10"))
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (10, 10, 10)
    full = load_splits(config(train, "--validation_file", str(val), "--test_file", str(test)))
    assert (len(full.train), len(full.validation), len(full.test)) == (100, 12, 20)


@pytest.mark.parametrize("bad_rows, message", [
    ([{"text": "a", "category": 1}], "missing column 'label'"),
    ([{"body": "a", "label": 1}], "missing column 'text'"),
    ([{"text": "ok", "label": 0}, {"text": "ok", "label": 9}], "row 2: label 9 is not one of the 4 classes"),
    ([{"text": "ok", "label": "World"}, {"text": "ok", "label": "Weather"}], "row 2: label 'Weather'"),
    ([{"text": "ok", "label": 0}, {"text": "   ", "label": 1}], "row 2: empty text"),
])
def test_bad_rows_are_reported_with_file_and_row(tmp_path, bad_rows, message):
    train = write_rows(tmp_path / "bad.jsonl", bad_rows * 1)
    with pytest.raises(DataError, match=message) as info:
        load_splits(config(train, "--label_names", *NAMES))
    assert "bad.jsonl" in str(info.value)


def test_unknown_label_in_validation_file_names_that_file(tmp_path):
    train = write_rows(tmp_path / "t.csv", rows(40, by_name=True))
    val = write_rows(tmp_path / "v.csv", [{"text": "ok", "label": "World"}, {"text": "x", "label": "Cooking"}])
    with pytest.raises(DataError, match=r"v\.csv: row 2: label 'Cooking'"):
        load_splits(config(train, "--validation_file", str(val)))


def test_empty_missing_and_unparsable_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not parquet at all" * 10)
    broken_json = tmp_path / "broken.jsonl"
    broken_json.write_text('{"text": "a", "label": 0}\n{"text": \n')
    for path, message in [(empty, "file is empty"), (header_only, "no rows"), (garbage, "cannot parse"),
                          (broken_json, "cannot parse"), (tmp_path / "absent.csv", "file not found")]:
        with pytest.raises(DataError, match=message) as info:
            load_splits(config(path))
        assert path.name in str(info.value)


def test_tokenized_batches_are_padded_to_the_longest_or_its_multiple_of_8(tmp_path, smoke_dir):
    train = write_rows(tmp_path / "t.csv", rows(64))
    cfg = config(train, "--model_name_or_path", str(smoke_dir / "model"), "--per_device_train_batch_size", "8",
                 "--max_length", "12")
    tokenizer = load_tokenizer(cfg)
    splits = tokenize_splits(load_splits(cfg), tokenizer, cfg)
    assert set(splits.train.column_names) == {"input_ids", "attention_mask", "labels", "length"}
    assert max(splits.train["length"]) <= 12  # truncated to max_length
    train_loader, sampler, val_loader, _ = make_dataloaders(splits, tokenizer, cfg, num_processes=1)
    for batch in list(train_loader) + list(val_loader):  # CPU default: to the longest text, no rounding
        assert batch["input_ids"].shape[1] == int(batch["attention_mask"].sum(1).max())
        assert batch["labels"].dtype == torch.long
    cfg.pad_to_multiple_of = 8  # the GPU default
    train_loader, _, val_loader, _ = make_dataloaders(splits, tokenizer, cfg, num_processes=1)
    for batch in list(train_loader) + list(val_loader):
        width = batch["input_ids"].shape[1]
        longest = int(batch["attention_mask"].sum(1).max())
        assert width % 8 == 0 and width - 8 < longest <= width
    # the second tokenization is read from the datasets cache: same fingerprint, no new cache file
    again = tokenize_splits(load_splits(cfg), tokenizer, cfg)
    assert again.train._fingerprint == splits.train._fingerprint
    assert again.train.cache_files == splits.train.cache_files
