"""The teacher's side of a distillation: its contract (labels, problem type), its scores on the unlabelled files (the
batch path: `agnews predict`, resumable shards, Ray where asked) and the rows the student trains and is measured on.
Called by training/distill/__main__.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from transformers import AutoConfig

from contract import files, templates
from contract.errors import UserError
from contract.loading import label_names
from contract.long_text import LongText
from contract.problem_types import ProblemType
from training.distill import service

logger = logging.getLogger(__name__)
GRADES = 10  # a reranker's training rows graded by the decile of the teacher's score
SCORES, HAS_LABEL = "teacher_scores", "has_label"  # the columns training reads (--teacher_column, --hard_label_column)


@dataclass(frozen=True)
class Columns:
    """Where the files hold their texts (and a pair's second text) and, in labelled files, the label."""

    text: str = "text"
    pair: str | None = None
    label: str = "label"

    def texts(self) -> list[str]:
        return [self.text, *([self.pair] if self.pair else [])]

    def flags(self) -> list[str]:
        """predict's and train's flags naming them."""
        return ["--text_column_names", self.text, *(["--text_pair_column", self.pair] if self.pair else [])]


@dataclass(frozen=True)
class Teacher:
    where: str  # a folder, or the URL of a running service of this project
    problem: ProblemType
    names: list[str]
    reading: tuple[str, ...] = ()  # train's flags for how it reads texts: template, length, windows (a copy's)
    layers: int = 0  # its transformer layers (a folder's config)

    @property
    def url(self) -> bool:
        return self.where.startswith(("http://", "https://"))

    @property
    def folder(self) -> Path:
        return Path(self.where)

    @classmethod
    def of(cls, where: str) -> Teacher:
        if where.startswith(("http://", "https://")):
            return service.teacher_at(where.rstrip("/"), cls)
        folder = Path(where)
        if not folder.is_dir():
            raise UserError(f"teacher: {folder} is not a folder (a checkpoint folder of this project, or any "
                            "save_pretrained folder) nor a service's URL")  # fmt: skip
        try:
            config = AutoConfig.from_pretrained(folder)
        except (OSError, ValueError) as exc:  # no config.json, or one transformers cannot read
            raise UserError(f"teacher: {folder}: not a model folder ({' '.join(str(exc).split())[:200]})") from None
        reading, layers = reading_flags(config, folder), getattr(config, "num_hidden_layers", 0)
        return cls(str(folder.resolve()), ProblemType.of(config), label_names(config, folder), reading, layers)

    def score_columns(self) -> list[str]:
        """predict's columns holding the teacher's scores, in output order."""
        if self.problem.classes:
            return [f"score_{name}" for name in self.names]
        return ["predicted_value"] if self.problem.name == "regression" else ["predicted_score"]

    def label_of(self, scored: pd.DataFrame) -> list:
        """The teacher's decision as a training label: a class id, a list of ids, the value, or a reranker's decile
        of its scores, 0 to 9 (the grades its validation ranks by; the score itself is the target)."""
        if self.problem.graded:
            score = scored[self.score_columns()[0]].astype(float)
            if score.nunique() < 2:
                raise UserError(f"teacher: {self.where} scores every pair {score.iloc[0]:.4f}: nothing to distil")
            return pd.qcut(score.rank(method="first"), GRADES, labels=False).astype(int).tolist()
        if self.problem.label_lists:
            ids = {name: i for i, name in enumerate(self.names)}
            return [[ids[name] for name in _as_list(cell)] for cell in scored["predicted_labels"]]
        if self.problem.classes:
            return scored[self.score_columns()].to_numpy().argmax(1).tolist()
        return scored[self.score_columns()[0]].astype(float).tolist()

    def label(self, cell, row: int, source: str):
        """A labelled file's own label as the teacher's class id (its name or its id), or the value."""
        if not self.problem.classes:
            return float(cell)
        if self.problem.label_lists:
            return [self.label(one, row, source) for one in _as_list(cell)]
        if str(cell) in self.names:
            return self.names.index(str(cell))
        if str(cell).lstrip("-").isdigit() and 0 <= int(cell) < len(self.names):
            return int(cell)
        raise UserError(f"{source}: row {row}: label {cell!r} is none of the teacher's ({', '.join(self.names)})")

    def write(self, frame: pd.DataFrame, path: Path, columns: Columns) -> None:
        """Training rows as parquet whose label column names every class (a ClassLabel): a class the teacher never
        chose on these texts keeps its id and name."""
        import datasets

        named = datasets.ClassLabel(names=self.names)
        label = datasets.Sequence(named) if self.problem.label_lists else named if self.problem.classes else None
        features = datasets.Features({
            **{name: datasets.Value("string") for name in columns.texts()},
            columns.label: label or datasets.Value("int64" if self.problem.graded else "float64"),
            SCORES: datasets.Sequence(datasets.Value("float64")),
            HAS_LABEL: datasets.Value("int64"),
        })  # fmt: skip
        datasets.Dataset.from_pandas(frame, features=features, preserve_index=False).to_parquet(str(path))


def reading_flags(config, folder: Path) -> tuple[str, ...]:
    """How the teacher read its texts (its prompt template, max_length, long-text windows) as train's flags, so a
    copy of its layers reads them alike."""
    trained = json.loads((folder / files.METRICS).read_text()) if (folder / files.METRICS).is_file() else {}
    windows = LongText.of(config)
    flags = {
        "--template": getattr(config, templates.CONFIG_FIELD, None),
        "--max_length": trained.get("config", {}).get("max_length"),
    }
    if windows.chunked:
        flags.update({"--long_text": windows.mode, "--max_length": windows.window,
                      "--chunk_stride": windows.stride, "--chunk_pooling": windows.pooling})  # fmt: skip
    return tuple(str(part) for flag, value in flags.items() if value is not None for part in (flag, value))


def _as_list(cell) -> list:
    """A multi-label cell: a list, or its JSON text."""
    try:
        values = json.loads(cell) if isinstance(cell, str) else list(cell)
    except (ValueError, TypeError):
        values = None
    if not isinstance(values, list):
        raise UserError(f"a multi-label cell must be a list of labels (a jsonl or parquet file): got {cell!r:.80}")
    return values


def label_files(teacher: Teacher, inputs: str, out: Path, columns: Columns, flags: list[str]) -> pd.DataFrame:
    """The teacher's scores on every row of `inputs` (a glob, folder or file): `agnews predict` (or the teacher's
    service) into `out`, one jsonl per shard, resumable (a rerun skips the shards already scored)."""
    if teacher.url:
        service.label_files(teacher, inputs, out, columns)
        return _read_scored(out)
    command = [sys.executable, "-m", "training.predict", "--checkpoint_dir", teacher.where, "--input_file",
               inputs, "--output_dir", str(out), "--output_format", "jsonl", *columns.flags(), "--mixed_precision",
               "fp32", *flags]  # fmt: skip
    logger.info("Teacher: scoring %s with %s", inputs, teacher.where)
    if subprocess.run(command, check=False).returncode != 0:
        raise UserError(f"teacher: scoring {inputs} stopped (its log is above); rerun to go on with the shards left")
    return _read_scored(out)


def _read_scored(out: Path) -> pd.DataFrame:
    shards = sorted(out.glob("*.jsonl"))
    return pd.concat([pd.read_json(path, lines=True, dtype=False) for path in shards], ignore_index=True)


def rows(teacher: Teacher, scored: pd.DataFrame, columns: Columns, labels: list | None) -> pd.DataFrame:
    """Training rows: the texts, the label (the teacher's decision where `labels` is None), the teacher's scores."""
    return pd.DataFrame({
        **{name: scored[name].astype(str) for name in columns.texts()},
        columns.label: teacher.label_of(scored) if labels is None else labels,
        SCORES: scored[teacher.score_columns()].astype(float).to_numpy().tolist(),
        HAS_LABEL: 0 if labels is None else 1,
    })  # fmt: skip
