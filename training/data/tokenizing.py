"""Tokenizing the splits: `datasets.map` (cached on disk) adding input ids and each text's token count; long texts
cut into windows where --long_text chunk.
"""

from __future__ import annotations

import datasets
from transformers import PreTrainedTokenizerBase

from contract.long_text import LongText, PairLeavesNoRoom
from training.config import TrainConfig
from training.data.errors import DataError
from training.data.reading import Splits


def tokenize_splits(splits: Splits, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig) -> Splits:
    """Tokenize without padding (the collator pads per batch): one row per window (contract/long_text.py; one per
    text unless --long_text chunk), with its token count (`length`) and its text's row (`document`).

    `datasets.map` caches the result next to the source data, keyed by the data and this function, so
    a second run (or the other ranks, which wait under `main_process_first`) reads it from disk.
    """
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
    """One split's `text` (and `text_pair`) as windows (unpadded input ids), each with its text's other columns
    (labels), its `length` and its text's row number, `document`; cached by `datasets.map`."""
    long_text = long_text or LongText()
    pairs = "text_pair" in ds.column_names
    long_text.check(tokenizer, max_length, pairs)  # before the tokenizer could abort the process on a bad stride

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
