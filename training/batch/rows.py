"""Rows to predictions, shared by one-file prediction (training/predict.py) and Ray's replicas (ray_data.py): which
columns hold the texts, scoring a chunk as the service scores it, the problem type's columns, and writing them.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute
import pyarrow.csv
import pyarrow.parquet
import torch

from contract.loading import LoadedModel
from contract.long_text import LongText
from contract.model_call import forward
from training.data.reading import join_texts


def text_columns(args: argparse.Namespace, trained_with: dict) -> tuple[list[str], str, str | None]:
    """(text columns, their delimiter, the pair column): the flags', else the training run's."""
    columns = args.text_column_names or trained_with.get("text_column_names") or ["text"]
    delimiter = args.text_column_delimiter or trained_with.get("text_column_delimiter", " ")
    return columns, delimiter, args.text_pair_column or trained_with.get("text_pair_column")


def max_length_for(args: argparse.Namespace, loaded: LoadedModel) -> int:
    """--max_length, else the training run's, else the model's."""
    return args.max_length or (loaded.metrics or {}).get("config", {}).get("max_length") or loaded.max_length


def joined(values, columns: list[str], delimiter: str, pair: str | None) -> tuple[list[str], list[str] | None]:
    """(texts, pairs) of a slice of rows: `values[column]` is each column's list of cells."""
    texts = [join_texts(parts, delimiter) for parts in zip(*(values[c] for c in columns))]
    return texts, ([p or "" for p in values[pair]] if pair else None)


def score_chunk(
    loaded: LoadedModel,
    texts: list[str],
    pairs: list[str] | None,
    batch_size: int,
    max_length: int,
    long_text: LongText,
) -> tuple[torch.Tensor, list[int]]:
    """(fp32 scores as the service scores them, windows per text), in input order; windows batched by length."""
    windows = long_text.encode(loaded.tokenizer, texts, pairs, max_length)
    features = windows.features
    # a window without tokens (whitespace only, for a tokenizer adding no special tokens) stays NaN: no prediction
    order = sorted(
        (i for i in range(len(features)) if features[i]["input_ids"]), key=lambda i: len(features[i]["input_ids"])
    )
    logits = torch.full((len(features), len(loaded.labels)), float("nan"))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        logits[rows] = forward(loaded, [features[i] for i in rows])
    pooled = long_text.pool(logits, windows.owner, len(texts))
    return loaded.problem.scores(pooled), windows.counts(len(texts))


def scored_table(scores: torch.Tensor, windows: list[int]) -> pa.Table:
    """A chunk's scores (one list per row) and window counts, as prediction_columns reads them."""
    column = pa.FixedSizeListArray.from_arrays(pa.array(scores.flatten().numpy()), scores.shape[-1])
    return pa.table({"scores": column, "windows": pa.array(windows, type=pa.int32())})


WINDOWS_COLUMN = "num_windows"  # --long_text chunk: the windows each row was scored in


def prediction_names(loaded: LoadedModel, long_text: LongText) -> list[str]:
    """The columns a prediction adds, by problem type, and window counts when chunked."""
    windows = [WINDOWS_COLUMN] if long_text.chunked else []
    return [*loaded.problem.prediction_names(loaded.labels), *windows]


def prediction_columns(table: pa.Table, loaded: LoadedModel, long_text: LongText) -> dict[str, pa.Array]:
    columns = _decided(table, loaded)
    if long_text.chunked:
        columns[WINDOWS_COLUMN] = table.column("windows").combine_chunks()
    return columns


def _decided(table: pa.Table, loaded: LoadedModel) -> dict[str, pa.Array]:
    """The problem type's columns (contract/problem_types.py `prediction_values`) from the scores; a row without
    scores (no tokens) gets empty cells, never a label decided from nothing."""
    values = table.column("scores").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    scores = torch.tensor(values).reshape(-1, len(loaded.labels))
    empty = torch.isnan(scores).all(1)
    scores = scores.nan_to_num(0.0)
    decided = loaded.problem.prediction_values(scores, loaded.labels)
    if not empty.any():
        return {name: _arrow(column) for name, column in decided.items()}
    blank = set(empty.nonzero().flatten().tolist())
    return {name: _arrow([None if i in blank else v for i, v in enumerate(list(col))]) for name, col in decided.items()}


def _arrow(column) -> pa.Array:
    """Label lists stay list<string> even when all empty."""
    listed = isinstance(column, list) and any(isinstance(row, list) for row in column[:1])
    return pa.array(column, type=pa.list_(pa.string())) if listed else pa.array(column)


CSV_LIST_DELIMITER = "|"  # a list cell in csv: "a|b"


def lists_joined(table: pa.Table) -> pa.Table:
    """CSV has no lists: items joined by CSV_LIST_DELIMITER."""
    for i, field in enumerate(table.schema):
        if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
            joined = [None if v is None else CSV_LIST_DELIMITER.join(map(str, v)) for v in table.column(i).to_pylist()]
            table = table.set_column(i, field.name, pa.array(joined, type=pa.string()))
    return table


class Writer:
    """Appends tables to a csv, jsonl or parquet file."""

    def __init__(self, path: Path, suffix: str):
        self.path, self.suffix, self.sink = path, suffix.lower(), None

    def write(self, table: pa.Table) -> None:
        if self.suffix == ".parquet":
            self.sink = self.sink or pyarrow.parquet.ParquetWriter(self.path, table.schema)
            self.sink.write_table(table)
        elif self.suffix == ".csv":
            table = lists_joined(table)
            self.sink = self.sink or pyarrow.csv.CSVWriter(self.path, table.schema)
            self.sink.write_table(table)
        else:  # jsonl: one object per line, chunk by chunk
            self.sink = self.sink or open(self.path, "w", encoding="utf-8")
            for row in table.to_pylist():
                self.sink.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


PREVIEW_ROWS = 3


class Tally:
    """What a labelled file holds, for prediction's closing line: the texts each label went to, and the first rows."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.preview: list[tuple[str, object]] = []

    def add(self, texts: pa.Array, decided: pa.Array) -> None:
        """One chunk's texts and decisions (a label, a list of labels, or a score), counted in Arrow: the rows stay
        off Python objects."""
        labels = decided.flatten() if pa.types.is_list(decided.type) else decided
        if pa.types.is_string(labels.type):
            for pair in pyarrow.compute.value_counts(labels.drop_null()).to_pylist():
                self.counts[pair["values"]] += pair["counts"]
        wanted = PREVIEW_ROWS - len(self.preview)
        if wanted > 0:
            self.preview += list(zip(texts.slice(0, wanted).to_pylist(), decided.slice(0, wanted).to_pylist()))

    def say(self) -> str:
        counted = ", ".join(f"{label} {count}" for label, count in self.counts.most_common())
        shown = "; ".join(f"{_cut(str(text))!r} -> {_shown(value)}" for text, value in self.preview)
        return f"{'by label: ' + counted + '; ' if counted else ''}first rows: {shown}"


def _cut(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _shown(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return ", ".join(value) or "(none)" if isinstance(value, list) else str(value)
