"""Tokenizing the splits with `datasets.map` (cached): ids, token counts, and windows with --long_text chunk."""

from __future__ import annotations

import datasets
from transformers import PreTrainedTokenizerBase

from contract.long_text import LongText, PairLeavesNoRoom
from training.config import TrainConfig
from training.data.errors import DataError
from training.data.reading import Splits


def tokenize_splits(splits: Splits, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig) -> Splits:
    """Tokenize unpadded: one row per window, with `length` and its text's `document` row."""
    long_text, workers = cfg.long_text_rule(), cfg.preprocessing_num_workers

    def split(ds: datasets.Dataset | None, name: str) -> datasets.Dataset | None:
        return None if ds is None else tokenize(ds, tokenizer, cfg.max_length, name, workers, long_text)

    return Splits(
        train=split(splits.train, "train"),
        validation=split(splits.validation, "validation"),
        test=split(splits.test, "test"),
        labels=splits.labels,
        calibration=splits.calibration,
        sources=splits.sources,
    )


def tokenize(
    ds: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    name: str,
    num_proc: int | None = None,
    long_text: LongText | None = None,
) -> datasets.Dataset:
    """One split as unpadded windows with their labels, `length` and `document`; cached."""
    long_text = long_text or LongText()
    pairs = "text_pair" in ds.column_names
    long_text.check(tokenizer, max_length, pairs)  # a bad stride would abort inside the tokenizer

    def encode(batch, rows):
        try:
            windows = long_text.encode(tokenizer, batch["text"], batch["text_pair"] if pairs else None, max_length)
        except PairLeavesNoRoom as exc:  # its index is within this batch: name the split's row
            raise DataError(f"{name}: row {rows[exc.index] + 1}: {exc.detail}") from None
        out = {key: [feature[key] for feature in windows.features] for key in windows.features[0]}
        out["length"] = [len(feature["input_ids"]) for feature in windows.features]
        out["document"] = [rows[i] for i in windows.owner]
        for column in kept:
            out[column] = [batch[column][i] for i in windows.owner]
        return out

    raw = [c for c in ("text", "text_pair") if c in ds.column_names]
    kept = [c for c in ds.column_names if c not in raw]
    return ds.map(
        encode,
        batched=True,
        with_indices=True,
        remove_columns=ds.column_names,
        desc=f"Tokenizing {name}",
        num_proc=num_proc,
    )
